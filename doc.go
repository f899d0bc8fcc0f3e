// Package pixlimit is the HTTP API of pixlimit: its routes, handlers, request decoding and the
// one error handler that maps domain errors to the contract's status codes and JSON bodies. Run
// wires it to its configuration, Redis and ledger; NewServer builds the handler from explicit
// dependencies, so tests and the demo can run several replicas over one Redis and one ledger.
//
// The domain lives below: internal/ratelimit (limits), internal/auth (who is asking),
// internal/pix (accounts and money), internal/config (environment).
package pixlimit
