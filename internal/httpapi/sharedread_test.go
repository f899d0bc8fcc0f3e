package httpapi

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// gatedReads is a ledger whose limits reads wait at a gate the test opens, one read at a time.
type gatedReads struct {
	pix.Ledger
	started chan struct{} // one send as each read starts
	gate    chan struct{} // one receive lets one read answer
	running atomic.Int32
	most    atomic.Int32
}

func (g *gatedReads) Limits(ctx context.Context, account string) (pix.MoneyLimits, error) {
	n := g.running.Add(1)
	defer g.running.Add(-1)
	for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
	}
	g.started <- struct{}{}
	<-g.gate
	return g.Ledger.Limits(ctx, account)
}

// TestRefusedRaisesShareLedgerReads: 50 refused PUTs of one account arriving while a read runs
// cost two reads, one at a time, and each caller's answer is from a read that started after it
// arrived: a lowering made before that is seen.
func TestRefusedRaisesShareLedgerReads(t *testing.T) {
	ctx := context.Background()
	accounts, err := pix.DemoAccounts(bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	memory, err := pix.NewMemoryLedger(accounts)
	if err != nil {
		t.Fatal(err)
	}
	account := accounts[0].ID
	ledger := &gatedReads{Ledger: memory, started: make(chan struct{}), gate: make(chan struct{})}
	reads := newLimitsReads(ledger)

	first := make(chan pix.MoneyLimits)
	go func() { l, _ := reads.Read(ctx, account); first <- l }()
	<-ledger.started // the first read runs, holding the old limits

	lower := int64(1_000)
	if _, err := memory.SetLimits(ctx, account, pix.MoneyLimitsChange{DayLimitCents: &lower}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	got := make([]pix.MoneyLimits, 50)
	for i := range got {
		wg.Go(func() { got[i], _ = reads.Read(ctx, account) })
	}
	for queued := 0; queued < 50; runtime.Gosched() { // the 50 callers wait behind the running read
		reads.mu.Lock()
		if next := reads.runs[account].next; next != nil {
			queued = next.joined
		}
		reads.mu.Unlock()
	}
	ledger.gate <- struct{}{} // the first read answers
	<-first
	<-ledger.started // the second read starts, for all 50
	ledger.gate <- struct{}{}
	wg.Wait()

	for i, l := range got {
		if l.DayLimitCents != lower {
			t.Fatalf("caller %d read day limit %d, want %d: it took a read that started before it came", i, l.DayLimitCents, lower)
		}
	}
	if got, want := ledger.most.Load(), int32(1); got != want {
		t.Errorf("%d reads ran at once, want %d", got, want)
	}
	reads.mu.Lock()
	defer reads.mu.Unlock()
	if len(reads.runs) != 0 {
		t.Errorf("%d accounts still hold a read after every caller was answered", len(reads.runs))
	}
}
