// Package pix owns the bank: accounts and their PIX keys, the ledger that moves money between
// them, and the statement. Money is always int64 cents. The Ledger interface is the boundary the
// HTTP layer talks to; MemoryLedger keeps one process's books, PostgresLedger a fleet's, and one
// table of tests drives both.
package pix
