package pix

import (
	"fmt"

	"golang.org/x/crypto/bcrypt"
)

// DemoAccounts are the contract's demo accounts: four persons (PF) and two companies (PJ), one
// of them with an alphanumeric CNPJ, their passwords hashed with bcrypt at cost (the replica's
// auth.Passwords cost). At bcrypt's default cost, a real deployment's, the hashes are the ones
// below, computed once so that starting a replica costs no hashing; at any other (a test's
// least cost) the published passwords are hashed again.
func DemoAccounts(cost int) ([]Account, error) {
	accounts := demoAccounts()
	if cost == bcrypt.DefaultCost {
		return accounts, nil
	}
	for i, pw := range demoPasswords {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), cost)
		if err != nil {
			return nil, fmt.Errorf("pix: demo accounts at cost %d: %w", cost, err)
		}
		accounts[i].PasswordHash = h
	}
	return accounts, nil
}

// demoPasswords are the demo accounts' published passwords (client.DemoAccounts), in order.
var demoPasswords = [...]string{"demo-ana-123", "demo-bruno-123", "demo-carla-123", "demo-diego-123", "demo-padaria-123", "demo-cafe-123"}

func demoAccounts() []Account {
	return []Account{
		{ID: "acct-ana", Name: "Ana Souza", Document: "52998224725", OpeningCents: 1_000_000,
			PasswordHash: []byte("$2a$10$eUbEOuN6nMWrBgCH8DAR9e7Trpm5mE4.ui1QN917O528ZQyYm3M5C"),
			Keys:         []string{"ana@example.com", "52998224725"}},
		{ID: "acct-bruno", Name: "Bruno Lima", Document: "39053344705", OpeningCents: 500_000,
			PasswordHash: []byte("$2a$10$f4SG9tLfQIE5VB.9WRuraOB.2Cj0fd9/Bs8IDxwCMlONDvExdGBSG"),
			Keys:         []string{"bruno@example.com", "+5511987654321", "39053344705"}},
		{ID: "acct-carla", Name: "Carla Dias", Document: "11144477735", OpeningCents: 250_000,
			PasswordHash: []byte("$2a$10$FEODv7kvSH3kD4CBKyT0LuZsvGqGwcnvwxl0tigY/KjijzgYX8xZO"),
			Keys:         []string{"carla@example.com", "11144477735"}},
		{ID: "acct-diego", Name: "Diego Costa", Document: "93541134780", OpeningCents: 100_000,
			PasswordHash: []byte("$2a$10$qx5UsoTJYJPPipklkXTDSug1vW1lQYeYlohoCXdP3yl.55IzetcUq"),
			Keys:         []string{"diego@example.com", "93541134780"}},
		{ID: "acct-padaria", Name: "Padaria Pão Quente Ltda", Document: "11222333000181", OpeningCents: 2_000_000,
			PasswordHash: []byte("$2a$10$owjI9xBBxr69/X8vWw3/duijqWQ6j45S6lMDeXYPZvkmWO7osuHZq"),
			Keys:         []string{"padaria@example.com", "11222333000181"}},
		{ID: "acct-cafe", Name: "Café Aurora Ltda", Document: "12ABC34501DE35", OpeningCents: 1_500_000,
			PasswordHash: []byte("$2a$10$OZe/T9CXo3u5antzFy0wv.aOg0A1iYR9GoC2OE22ZA0.UNPrwQ7yG"),
			Keys:         []string{"cafe@example.com", "12ABC34501DE35"}},
	}
}
