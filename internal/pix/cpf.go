package pix

import (
	"errors"
	"strings"
)

// ErrInvalidCPF is returned by ParseCPF.
var ErrInvalidCPF = errors.New("not a valid CPF")

// ParseCPF normalizes a CPF, with or without its usual punctuation ("529.982.247-25" or
// "52998224725"), to its 11 digits and validates the two check digits. Sequences of one repeated
// digit pass the check-digit arithmetic but are not issued, and are rejected.
func ParseCPF(s string) (string, error) {
	if len(s) > 14 {
		return "", ErrInvalidCPF
	}
	var d [11]byte
	n := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			if n == len(d) {
				return "", ErrInvalidCPF
			}
			d[n] = c - '0'
			n++
		case c == '.' || c == '-':
		default:
			return "", ErrInvalidCPF
		}
	}
	if n != 11 || strings.Count(s, ".") > 2 || strings.Count(s, "-") > 1 {
		return "", ErrInvalidCPF
	}
	if s != string(digits(d)) && s != formatCPF(d) {
		return "", ErrInvalidCPF // punctuation only where it belongs: 000.000.000-00
	}
	same := true
	for _, x := range d[1:] {
		same = same && x == d[0]
	}
	if same || checkDigit(d[:9]) != d[9] || checkDigit(d[:10]) != d[10] {
		return "", ErrInvalidCPF
	}
	return string(digits(d)), nil
}

// checkDigit is the mod-11 check digit of a CPF prefix (9 digits for the first, 10 for the
// second): weights count down to 2 from len+1.
func checkDigit(prefix []byte) byte {
	sum := 0
	for i, x := range prefix {
		sum += int(x) * (len(prefix) + 1 - i)
	}
	r := sum * 10 % 11
	if r == 10 {
		r = 0
	}
	return byte(r)
}

func digits(d [11]byte) []byte {
	b := make([]byte, 11)
	for i, x := range d {
		b[i] = '0' + x
	}
	return b
}

func formatCPF(d [11]byte) string {
	b := digits(d)
	return string(b[0:3]) + "." + string(b[3:6]) + "." + string(b[6:9]) + "-" + string(b[9:11])
}

// CompleteCPF appends the two check digits to a 9-digit CPF base: CompleteCPF("529982247") is
// "52998224725". Tests and the demo use it to make valid CPFs that belong to nobody.
func CompleteCPF(base string) (string, error) {
	var d [11]byte
	if len(base) != 9 {
		return "", ErrInvalidCPF
	}
	for i := 0; i < 9; i++ {
		if base[i] < '0' || base[i] > '9' {
			return "", ErrInvalidCPF
		}
		d[i] = base[i] - '0'
	}
	d[9] = checkDigit(d[:9])
	d[10] = checkDigit(d[:10])
	return ParseCPF(string(digits(d)))
}
