package pix

import (
	"context"
	"errors"
	"math/rand/v2"
	"regexp"
	"sync"
	"testing"
)

func TestParseCPF(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"529.982.247-25", "52998224725", true},
		{"52998224725", "52998224725", true},
		{"111.444.777-35", "11144477735", true},
		{"529.982.247-26", "", false}, // second check digit
		{"529.982.247-15", "", false}, // first check digit
		{"111.111.111-11", "", false}, // all equal: passes the arithmetic, never issued
		{"00000000000", "", false},
		{"5299822472", "", false},
		{"529982247255", "", false},
		{"529.982.24725", "", false}, // punctuation only where it belongs
		{"529-982-247.25", "", false},
		{"52998224725 ", "", false},
		{"", "", false},
		{"５２９９８２２４７２５", "", false}, // full-width digits are not digits here
	}
	for _, tt := range tests {
		got, err := ParseCPF(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseCPF(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestCompleteCPF(t *testing.T) {
	for base, want := range map[string]string{"529982247": "52998224725", "111444777": "11144477735", "390533447": "39053344705"} {
		if got, err := CompleteCPF(base); err != nil || got != want {
			t.Errorf("CompleteCPF(%s) = %s, %v; want %s", base, got, err, want)
		}
	}
	for _, bad := range []string{"111111111", "12345678", "12345678a"} {
		if got, err := CompleteCPF(bad); err == nil {
			t.Errorf("CompleteCPF(%s) = %s, want an error", bad, got)
		}
	}
}

func FuzzParseCPF(f *testing.F) {
	for _, s := range []string{"529.982.247-25", "52998224725", "111.111.111-11", "abc", ""} {
		f.Add(s)
	}
	digits := regexp.MustCompile(`^[0-9]{11}$`)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseCPF(s)
		if err != nil {
			return
		}
		if !digits.MatchString(got) {
			t.Fatalf("ParseCPF(%q) = %q: not 11 digits", s, got)
		}
		if again, err := ParseCPF(got); err != nil || again != got {
			t.Fatalf("ParseCPF(%q) = %q, %v: not idempotent", got, again, err)
		}
	})
}

func TestParseKey(t *testing.T) {
	tests := []struct {
		in, want string
		typ      KeyType
	}{
		{"ana@example.com", "ana@example.com", KeyEmail},
		{"Ana@Example.COM", "ana@example.com", KeyEmail},
		{"+5511987654321", "+5511987654321", KeyPhone},
		{"529.982.247-25", "52998224725", KeyCPF},
		{"123E4567-E89B-42D3-A456-426614174000", "123e4567-e89b-42d3-a456-426614174000", KeyRandom},
		{"ana@", "", ""},
		{"@example.com", "", ""},
		{"ana@example", "", ""},
		{"ana@@example.com", "", ""},
		{"a na@example.com", "", ""},
		{"ana@-example.com", "", ""},
		{"+0511987654321", "", ""},
		{"+55 11 98765-4321", "", ""},
		{"+551", "", ""},
		{"11987654321", "", ""}, // a phone without + is not E.164 (and not a valid CPF)
		{"123e4567e89b42d3a456426614174000", "", ""},
		{"123e4567-e89b-42d3-a456-42661417400g", "", ""},
		{"", "", ""},
	}
	for _, tt := range tests {
		got, typ, err := ParseKey(tt.in)
		if got != tt.want || typ != tt.typ || (err == nil) != (tt.typ != "") {
			t.Errorf("ParseKey(%q) = %q, %q, %v; want %q, %q", tt.in, got, typ, err, tt.want, tt.typ)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"ana@example.com", "+5511987654321", "52998224725", "123e4567-e89b-42d3-a456-426614174000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, typ, err := ParseKey(s)
		if err != nil {
			return
		}
		again, typ2, err := ParseKey(got)
		if err != nil || again != got || typ2 != typ {
			t.Fatalf("ParseKey(%q) = %q (%s) but ParseKey of that = %q (%s), %v", s, got, typ, again, typ2, err)
		}
	})
}

func newDemoLedger(t *testing.T) *MemoryLedger {
	t.Helper()
	l, err := NewMemoryLedger(DemoAccounts())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestTransferErrors(t *testing.T) {
	ctx := context.Background()
	l := newDemoLedger(t)
	for _, tt := range []struct {
		req  TransferRequest
		want error
	}{
		{TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: 0}, ErrInvalidAmount},
		{TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: -5}, ErrInvalidAmount},
		{TransferRequest{From: "acct-diego", ToKey: "nobody@example.com", AmountCents: 1}, ErrKeyNotFound},
		{TransferRequest{From: "acct-diego", ToKey: "diego@example.com", AmountCents: 1}, ErrSameAccount},
		{TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: 100_001}, ErrInsufficientFunds},
		{TransferRequest{From: "acct-nobody", ToKey: "ana@example.com", AmountCents: 1}, ErrAccountNotFound},
	} {
		if _, err := l.Transfer(ctx, tt.req); !errors.Is(err, tt.want) {
			t.Errorf("Transfer(%+v) = %v, want %v", tt.req, err, tt.want)
		}
	}
	st, _ := l.Statement(ctx, "acct-diego", 10)
	if st.BalanceCents != 100_000 || len(st.Entries) != 0 {
		t.Errorf("after only failed transfers: balance %d, %d entries; want 100000, 0", st.BalanceCents, len(st.Entries))
	}
}

func TestConcurrentTransfersKeepTheBooks(t *testing.T) {
	ctx := context.Background()
	l := newDemoLedger(t)
	accounts := DemoAccounts()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for range 100 {
				from, to := accounts[rng.IntN(4)], accounts[rng.IntN(4)]
				_, err := l.Transfer(ctx, TransferRequest{From: from.ID, ToKey: to.Keys[0], AmountCents: int64(1 + rng.IntN(60_000))})
				if err != nil && !errors.Is(err, ErrInsufficientFunds) && !errors.Is(err, ErrSameAccount) {
					t.Errorf("transfer: %v", err)
				}
			}
		})
	}
	wg.Wait()
	var total int64
	legs := map[string][]Direction{}
	for _, a := range accounts {
		st, err := l.Statement(ctx, a.ID, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		sum := a.OpeningCents
		for i, e := range st.Entries {
			if i > 0 && e.CreatedAt.After(st.Entries[i-1].CreatedAt) {
				t.Errorf("%s: statement not newest first at %d", a.ID, i)
			}
			if e.Direction == In {
				sum += e.AmountCents
			} else {
				sum -= e.AmountCents
			}
			legs[e.EndToEndID] = append(legs[e.EndToEndID], e.Direction)
		}
		if sum != st.BalanceCents {
			t.Errorf("%s: opening + entries = %d, balance = %d", a.ID, sum, st.BalanceCents)
		}
		if st.BalanceCents < 0 {
			t.Errorf("%s: negative balance %d", a.ID, st.BalanceCents)
		}
		total += st.BalanceCents
	}
	if total != 1_850_000 {
		t.Errorf("total %d, want 1850000", total)
	}
	for id, d := range legs {
		if len(d) != 2 || d[0] == d[1] {
			t.Errorf("transfer %s has legs %v, want one out and one in", id, d)
		}
	}
	if len(legs) < 300 {
		t.Errorf("only %d transfers succeeded: too few to prove anything", len(legs))
	}
}
