package pix

import (
	"testing"
	"unicode/utf8"
)

// Published examples: the Receita Federal's alphanumeric example (12.ABC.345/01DE-35, from its
// note on IN RFB 2.229/2024), the usual numeric example of the documentation of every CNPJ
// validator (11.222.333/0001-81), and the Banco do Brasil's CNPJ (00.000.000/0001-91).
func TestParseCNPJ(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"12.ABC.345/01DE-35", "12ABC34501DE35"},
		{"12ABC34501DE35", "12ABC34501DE35"},
		{"12abc34501de35", "12ABC34501DE35"}, // lower case is upper-cased
		{"12.abc.345/01de-35", "12ABC34501DE35"},
		{"11.222.333/0001-81", "11222333000181"},
		{"11222333000181", "11222333000181"},
		{"00.000.000/0001-91", "00000000000191"},
	} {
		got, err := ParseCNPJ(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseCNPJ(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{
		"", "12ABC34501DE36", "12ABC34501DE53", "11222333000182", "11222333000118",
		"12ABC34501DEA5",      // a letter as a check digit
		"12.ABC.345/01DE-3",   // too short
		"12ABC.34501DE35",     // punctuation where it does not belong
		"12-ABC-345/01DE.35",  // the wrong punctuation
		"11.222.333/0001-81 ", // a trailing space
		"00000000000000",      // one repeated character
		"AAAAAAAAAAAA" + "00", // likewise, whatever its check digits
		"12ÁBC34501DE35",      // not ASCII
		"12abc34501de3\u0035\u0000"[:14] + "x",
	} {
		if got, err := ParseCNPJ(in); err == nil {
			t.Errorf("ParseCNPJ(%q) = %q, want an error", in, got)
		}
	}
}

func TestCompleteCNPJ(t *testing.T) {
	for base, want := range map[string]string{"12ABC34501DE": "12ABC34501DE35", "112223330001": "11222333000181"} {
		if got, err := CompleteCNPJ(base); err != nil || got != want {
			t.Errorf("CompleteCNPJ(%q) = %q, %v; want %q", base, got, err, want)
		}
	}
}

func TestParseDocument(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		person   Person
	}{
		{"529.982.247-25", "52998224725", PF},
		{"52998224725", "52998224725", PF},
		{"11.222.333/0001-81", "11222333000181", PJ},
		{"12.abc.345/01de-35", "12ABC34501DE35", PJ},
	} {
		got, person, err := ParseDocument(tc.in)
		if err != nil || got != tc.want || person != tc.person || PersonOf(got) != tc.person {
			t.Errorf("ParseDocument(%q) = %q, %q, %v; want %q, %q", tc.in, got, person, err, tc.want, tc.person)
		}
		if f := FormatDocument(got); f != tc.in && f != FormatDocument(tc.want) {
			t.Errorf("FormatDocument(%q) = %q", got, f)
		}
	}
	for _, in := range []string{"", "529.982.247-26", "11.222.333/0001-82", "5299822472", "abc"} {
		if _, _, err := ParseDocument(in); err == nil {
			t.Errorf("ParseDocument(%q): want an error", in)
		}
	}
}

// FuzzParseDocument: whatever the input, ParseDocument never panics, and what it accepts is
// normalized (11 digits or 14 characters of 0-9 A-Z ending in two digits), parses to itself and
// keeps its person.
func FuzzParseDocument(f *testing.F) {
	for _, s := range []string{"529.982.247-25", "12.ABC.345/01DE-35", "11222333000181", "12abc34501de35", "00000000000191", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, person, err := ParseDocument(s)
		if err != nil {
			return
		}
		if !utf8.ValidString(d) || (len(d) != 11 && len(d) != 14) || PersonOf(d) != person {
			t.Fatalf("ParseDocument(%q) = %q, %q", s, d, person)
		}
		for i := range len(d) {
			c := d[i]
			if !(c >= '0' && c <= '9' || i < 12 && len(d) == 14 && c >= 'A' && c <= 'Z') {
				t.Fatalf("ParseDocument(%q) = %q: byte %d is %q", s, d, i, c)
			}
		}
		again, p2, err := ParseDocument(d)
		if err != nil || again != d || p2 != person {
			t.Fatalf("ParseDocument(%q) = %q, %v; want itself", d, again, err)
		}
	})
}
