package pix

import (
	"errors"
	"strings"
)

// Person is who holds an account: a natural person (PF, pessoa física, identified by a CPF) or a
// company (PJ, pessoa jurídica, identified by a CNPJ). Limits differ by person: the DICT anti-scan
// buckets are ten times larger for companies, and the night cap applies between natural persons
// only.
type Person string

// The persons.
const (
	PF Person = "PF"
	PJ Person = "PJ"
)

// PersonOf tells a normalized document's person: 11 characters are a CPF, 14 a CNPJ.
func PersonOf(document string) Person {
	if len(document) == 14 {
		return PJ
	}
	return PF
}

// ErrInvalidDocument is returned by ParseDocument.
var ErrInvalidDocument = errors.New("not a valid CPF or CNPJ")

// ErrInvalidCNPJ is returned by ParseCNPJ.
var ErrInvalidCNPJ = errors.New("not a valid CNPJ")

// ParseDocument normalizes and validates a CPF or a CNPJ (numeric or alphanumeric), with or
// without its punctuation, and tells which it is.
func ParseDocument(s string) (string, Person, error) {
	if cpf, err := ParseCPF(s); err == nil {
		return cpf, PF, nil
	}
	if cnpj, err := ParseCNPJ(s); err == nil {
		return cnpj, PJ, nil
	}
	return "", "", ErrInvalidDocument
}

// ParseCNPJ normalizes a CNPJ to its 14 characters and validates its two check digits. Since July
// 2026 new CNPJs are alphanumeric (Receita Federal, IN RFB 2.229/2024): 12 characters of 0-9 and
// A-Z, then two numeric check digits. Lower case is upper-cased; the punctuation, when present,
// is where it belongs (12.ABC.345/01DE-35 or 12ABC34501DE35).
//
// Each check digit is module 11 over the characters before it, weighted 2 to 9 from the right
// and again from 2, each character valued at its ASCII code minus 48 (so '0'-'9' are 0-9 and 'A'
// is 17, 'Z' 42): a remainder below 2 gives 0, else 11 minus it. A numeric CNPJ's digits keep
// their values, so the one rule checks both forms. A base of one repeated character passes the
// arithmetic but is not issued, and is rejected.
func ParseCNPJ(s string) (string, error) {
	if len(s) != 14 && len(s) != 18 {
		return "", ErrInvalidCNPJ
	}
	s = upperASCII(s)
	if len(s) == 18 {
		if s[2] != '.' || s[6] != '.' || s[10] != '/' || s[15] != '-' {
			return "", ErrInvalidCNPJ
		}
		s = s[0:2] + s[3:6] + s[7:10] + s[11:15] + s[16:18]
	}
	for i := 0; i < 14; i++ {
		c := s[i]
		digit := c >= '0' && c <= '9'
		if !digit && (i >= 12 || c < 'A' || c > 'Z') {
			return "", ErrInvalidCNPJ // check digits are numeric; the base is 0-9 A-Z
		}
	}
	if strings.Count(s[:12], s[:1]) == 12 {
		return "", ErrInvalidCNPJ
	}
	if cnpjCheckDigit(s[:12]) != s[12] || cnpjCheckDigit(s[:13]) != s[13] {
		return "", ErrInvalidCNPJ
	}
	return s, nil
}

// cnpjCheckDigit is the check digit of a CNPJ prefix (12 characters for the first, 13 for the
// second), as a character.
func cnpjCheckDigit(prefix string) byte {
	sum := 0
	for i := range len(prefix) {
		weight := 2 + (len(prefix)-1-i)%8 // 2..9 from the right, cycling
		sum += int(prefix[i]-'0') * weight
	}
	r := sum % 11
	if r < 2 {
		return '0'
	}
	return byte('0' + 11 - r)
}

// CompleteCNPJ appends the two check digits to a 12-character CNPJ base (0-9 A-Z):
// CompleteCNPJ("12ABC34501DE") is "12ABC34501DE35". Tests and the demo use it to make valid
// CNPJs.
func CompleteCNPJ(base string) (string, error) {
	if len(base) != 12 {
		return "", ErrInvalidCNPJ
	}
	base = upperASCII(base)
	first := cnpjCheckDigit(base)
	return ParseCNPJ(base + string(first) + string(cnpjCheckDigit(base+string(first))))
}

// upperASCII upper-cases a-z and leaves every other byte as it is (strings.ToUpper would turn
// invalid UTF-8 into longer replacement characters).
func upperASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// FormatDocument punctuates a normalized document as it is written: 529.982.247-25 or
// 12.ABC.345/01DE-35.
func FormatDocument(d string) string {
	switch len(d) {
	case 11:
		return d[0:3] + "." + d[3:6] + "." + d[6:9] + "-" + d[9:11]
	case 14:
		return d[0:2] + "." + d[2:5] + "." + d[5:8] + "/" + d[8:12] + "-" + d[12:14]
	}
	return d
}
