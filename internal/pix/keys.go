package pix

import (
	"errors"
	"strings"
)

// KeyType is the kind of a PIX key.
type KeyType string

// The PIX key types the central bank defines.
const (
	KeyCPF    KeyType = "cpf"
	KeyCNPJ   KeyType = "cnpj"
	KeyEmail  KeyType = "email"
	KeyPhone  KeyType = "phone"
	KeyRandom KeyType = "random"
)

// ErrInvalidKey is returned by ParseKey.
var ErrInvalidKey = errors.New("not a valid PIX key: want a CPF, a CNPJ, an e-mail, a phone in E.164 (+5511987654321) or a random key (UUID)")

// ParseKey recognises and normalizes a PIX key: a CPF (11 digits, punctuation allowed), a CNPJ
// (14 characters, numeric or alphanumeric, punctuation allowed, upper-cased), an e-mail
// (lowercased, at most 77 characters as the central bank allows), a phone in E.164 or a random key
// (a UUID, lowercased).
func ParseKey(s string) (string, KeyType, error) {
	switch {
	case strings.HasPrefix(s, "+"):
		if !isE164(s) {
			return "", "", ErrInvalidKey
		}
		return s, KeyPhone, nil
	case strings.Contains(s, "@"):
		if !isEmail(s) {
			return "", "", ErrInvalidKey
		}
		return strings.ToLower(s), KeyEmail, nil
	case len(s) == 36:
		if !isUUID(s) {
			return "", "", ErrInvalidKey
		}
		return strings.ToLower(s), KeyRandom, nil
	}
	if cpf, err := ParseCPF(s); err == nil {
		return cpf, KeyCPF, nil
	}
	if cnpj, err := ParseCNPJ(s); err == nil {
		return cnpj, KeyCNPJ, nil
	}
	return "", "", ErrInvalidKey
}

// V2 reports whether the key's type is counted by DICT's ENTRIES_READ_USER_ANTISCAN_V2 bucket
// (CPF, CNPJ and random keys) rather than by ENTRIES_READ_USER_ANTISCAN (e-mail and phone).
func (t KeyType) V2() bool { return t == KeyCPF || t == KeyCNPJ || t == KeyRandom }

// isE164: "+", a non-zero country code digit, 8 to 15 digits in all.
func isE164(s string) bool {
	d := s[1:]
	if len(d) < 8 || len(d) > 15 || d[0] == '0' {
		return false
	}
	for i := 0; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return false
		}
	}
	return true
}

// isEmail is deliberately plain: one @, a non-empty local part, a dotted domain of letters,
// digits and hyphens, printable ASCII without spaces, at most 77 characters.
func isEmail(s string) bool {
	if len(s) > 77 {
		return false
	}
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" || strings.Contains(domain, "@") || !strings.Contains(domain, ".") {
		return false
	}
	for i := 0; i < len(local); i++ {
		if c := local[i]; c <= ' ' || c > '~' || strings.IndexByte(`"(),:;<>[\]`, c) >= 0 {
			return false
		}
	}
	for _, label := range strings.Split(domain, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i] | 0x20
			if !(c >= 'a' && c <= 'z' || label[i] >= '0' && label[i] <= '9' || label[i] == '-') {
				return false
			}
		}
	}
	return true
}

func isUUID(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'f') {
				return false
			}
		}
	}
	return true
}
