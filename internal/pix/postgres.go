package pix

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// PostgresLedger is the Ledger of a fleet: every replica reads and writes one PostgreSQL
// database, so balances, statements and idempotency records are the same whichever replica
// answers, and survive restarts.
//
// Every call ends within the ledger's timeout: a hung or unreachable database answers
// ErrUnavailable, never a request that waits until its client gives up. The deadline is kept
// twice: on the client, as a context deadline on each call (pgx then abandons the connection),
// and on the server, as statement_timeout, so a statement the client gave up on does not keep
// holding row locks.
type PostgresLedger struct {
	pool    *pgxpool.Pool
	timeout time.Duration
	now     func() time.Time
	rules   Rules
	// dbClock: Now reads the database's clock (clock_timestamp()), every replica's one clock;
	// false when a test set the clock (WithClock).
	dbClock bool
	// tokensLive bounds the removals kept (WithTokenLifetime; zero: all).
	tokensLive time.Duration
}

// DefaultTimeout is the deadline of one ledger call when OpenPostgres is given none.
const DefaultTimeout = 2 * time.Second

// OpenPostgres connects to url, brings the schema up to date and, when given accounts, seeds
// those that do not exist yet. Any number of replicas may open one database at once. timeout
// bounds each later call (zero means DefaultTimeout); opening itself is bounded by ctx.
func OpenPostgres(ctx context.Context, url string, timeout time.Duration, accounts []Account, opts ...Option) (*PostgresLedger, error) {
	o := newOptions(opts)
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pix: postgres: %w", err)
	}
	// Opening migrates and seeds on a connection of its own, dialed as pgx dials, before any
	// of the bounds below: those are for calls that must answer within DB_TIMEOUT, while a
	// replica that starts beside a busy database (or on a loaded machine, where a 300 ms timeout
	// cut the migration's dial) can wait for it, up to ctx or startupConnect.
	setup := cfg.ConnConfig.Copy()
	if setup.ConnectTimeout == 0 {
		setup.ConnectTimeout = startupConnect
	}
	setup.RuntimeParams["statement_timeout"] = "0" // a migration may take as long as it takes
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(max(1, timeout.Milliseconds()), 10)
	// A transaction idle for longer than a whole call's budget belongs to a call that has
	// ended: its COMMIT or ROLLBACK was lost on the way (a network cut, a half-open
	// connection), and the server would otherwise keep its row locks, the payer's among them,
	// until TCP keepalive ends the session, hours later; every PIX of that account, its honest
	// retry included, would wait on them. The server ends such a session after twice the
	// budget, and a second at least (a pause between a transfer's statements and its COMMIT,
	// a GC's or a loaded machine's, must not end a healthy one), and so rolls back a
	// transaction nobody will finish (TestALostCommitFreesThePayer).
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(max(2*timeout, time.Second).Milliseconds(), 10)
	// A connection to the database waits at most limit for anything: its dial, the cancel
	// request pgx dials when a call's deadline ends mid-query, and the clean-up of a broken
	// connection (boundedConn). pgxpool dials in the background, detached from the caller's
	// deadline, and keeps a broken connection's place in the pool until pgx has cleaned it up,
	// for which pgx allows itself 15 s: across a network cut, the calls in flight broke their
	// connections, and their clean-ups held every place in the pool (4 on two cores) for 15 s,
	// the replica's /readyz failing on the database 3 s after its network was back
	// (deploy/e2e.sh's cut drill; pgxpool's Stat said: 4 acquired, 0 idle). A database on the
	// same network answers in milliseconds.
	limit := min(timeout, time.Second)
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > limit {
		cfg.ConnConfig.ConnectTimeout = limit
	}
	cfg.ConnConfig.DialFunc = boundedDial(limit)
	// A connection told its transaction is read-only (25006) was opened while the database was
	// (default_transaction_read_only, set for the database or the role, is read at connect and
	// holds for the connection's life) or reaches a primary demoted under it: it is closed, so
	// that the pool's next one sees the database as it is now. Kept, it refused every write for
	// up to the pool's connection lifetime (an hour) after the database was writable again.
	onPgError := cfg.ConnConfig.OnPgError
	cfg.ConnConfig.OnPgError = func(c *pgconn.PgConn, e *pgconn.PgError) bool {
		return e.Code != "25006" && (onPgError == nil || onPgError(c, e))
	}

	conn, err := pgx.ConnectConfig(ctx, setup)
	if err != nil {
		return nil, fmt.Errorf("pix: postgres: %w", err)
	}
	defer func() { // within a second, even once ctx is done: a dead network holds no start
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		conn.Close(ctx)
	}()
	if err := migrate(ctx, conn); err != nil {
		return nil, err
	}
	if err := seed(ctx, conn, accounts); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pix: postgres: %w", err)
	}
	return &PostgresLedger{pool: pool, timeout: timeout, now: o.now, rules: o.rules, dbClock: !o.clockSet, tokensLive: o.tokensLive}, nil
}

// Now implements Ledger: the database's clock, which every replica shares (a replica's own
// clock may be off by more than the time between a revocation and a login).
func (l *PostgresLedger) Now(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	t, err := l.clock(ctx, l.pool)
	if err != nil {
		return time.Time{}, fmt.Errorf("pix: clock: %w", unavailable(err))
	}
	return t, nil
}

// clock reads the ledger's clock through q (the pool, or a transaction).
func (l *PostgresLedger) clock(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (time.Time, error) {
	if !l.dbClock {
		return l.now().UTC().Truncate(time.Microsecond), nil
	}
	var t time.Time
	err := q.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
	return t.UTC(), err
}

// at is the time a statement judges at, as its argument of `coalesce($n::timestamptz,
// clock_timestamp())`: nil, the database's clock as the statement runs, or the test's (WithClock).
// A replica's own clock is never the ledger's: one running behind would stamp a PIX before
// 20:00 that another had stamped after, and send it past the night cap.
func (l *PostgresLedger) at() any {
	if l.dbClock {
		return nil
	}
	return l.now().UTC().Truncate(time.Microsecond)
}

// startupConnect bounds the dial of the connection that migrates, when DATABASE_URL sets no
// connect_timeout.
const startupConnect = 10 * time.Second

// Busy implements Ledger: the pool holds its most connections, and none is idle.
func (l *PostgresLedger) Busy() bool {
	st := l.pool.Stat()
	return st.TotalConns() >= st.MaxConns() && st.IdleConns() == 0
}

// Close closes the connection pool.
func (l *PostgresLedger) Close() { l.pool.Close() }

// boundedDial dials with at most limit, and returns connections whose deadlines lie at most limit
// ahead (see OpenPostgres).
func boundedDial(limit time.Duration) pgconn.DialFunc {
	d := &net.Dialer{} // as pgx's own
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return boundedConn{Conn: c, limit: limit}, nil
	}
}

// boundedConn is a connection whose deadlines lie at most limit ahead: a deadline further off
// (pgx's 15 s for cleaning up a broken connection) is brought forward to limit from now. No
// deadline (the zero time) stays none: a call's own deadline comes from its context.
type boundedConn struct {
	net.Conn
	limit time.Duration
}

func (c boundedConn) bound(t time.Time) time.Time {
	if lim := time.Now().Add(c.limit); !t.IsZero() && t.After(lim) {
		return lim
	}
	return t
}

func (c boundedConn) SetDeadline(t time.Time) error      { return c.Conn.SetDeadline(c.bound(t)) }
func (c boundedConn) SetReadDeadline(t time.Time) error  { return c.Conn.SetReadDeadline(c.bound(t)) }
func (c boundedConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.bound(t)) }

// Ping checks the database answers within the ledger's timeout, and takes writes (else
// errReadOnly: a ledger that cannot move money is not ready). A ping that found no answer,
// by its own deadline or its caller's (/readyz gives it a second), resets the pool: its idle
// connections are closed, and the ones in use when they come back. After a network cut every
// idle connection can be dead, and the next pings would otherwise each take one of them and wait
// out their timeout on it, one at a time (TestAFailedPingDropsTheDeadConnections). A caller
// that left (cancelled) resets nothing. The price of a ping that failed for another reason is
// a pool dialled afresh.
//
// A ping that found every connection at work (transfers waiting on a popular payee's row, say)
// is answered ready, and resets nothing: the pool is busy, not down. Were the database gone,
// those connections fail within the ledger's timeout and the next ping asks it afresh
// (TestABusyPoolIsReady).
func (l *PostgresLedger) Ping(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	conn, err := l.pool.Acquire(pctx)
	if err != nil {
		if st := l.pool.Stat(); pctx.Err() != nil && st.AcquiredConns() >= st.MaxConns() {
			return nil
		}
		if !errors.Is(ctx.Err(), context.Canceled) {
			l.pool.Reset()
		}
		return unavailable(err)
	}
	defer conn.Release()
	var readOnly string // a database that answers but cannot be written is no ledger: not ready
	err = conn.QueryRow(pctx, "SELECT current_setting('transaction_read_only')").Scan(&readOnly)
	if err == nil && readOnly == "on" {
		err = errReadOnly
	}
	if err != nil && !errors.Is(ctx.Err(), context.Canceled) { // a deadline, the caller's own too, is no answer
		l.pool.Reset() // read-only connections included: the next ones see the database as it is now
	}
	return unavailable(err)
}

// errReadOnly is Ping's answer from a database that takes no writes: a standby, a demoted
// primary, or default_transaction_read_only set.
var errReadOnly = errors.New("pix: the database is read-only")

// unavailable wraps err in ErrUnavailable when it means the ledger could not do its work for a
// reason of the database's state, not of the request: no answer came (a deadline passed, no
// connection could be made, one broke) or the server answered that it cannot serve now (the
// codes of serverUnavailable). Such a failure is a 503 the client may retry; any other error
// the server reported is a bug to fix, a 500. Domain errors (ErrInsufficientFunds, ...) and a
// client that left (context.Canceled) pass unchanged. It is for failures before COMMIT was
// sent; after, see commitOutcome.
func unavailable(err error) error {
	var (
		pgErr   *pgconn.PgError
		connErr *pgconn.ConnectError
	)
	switch {
	case err == nil, errors.Is(err, context.Canceled), isDomain(err):
		return err
	case errors.As(err, &connErr): // even one the server refused (starting up, too many clients)
	case errors.As(err, &pgErr) && !serverUnavailable(pgErr):
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// serverUnavailable reports whether the server's error says it cannot serve now, rather than
// that the request was wrong: a PostgreSQL restart, failover or overload. By SQLSTATE:
// 08 connection exceptions; 53 insufficient resources (too many connections, disk full, out of
// memory); 57P01-57P05 shutdown, crash, cannot connect now, idle-session timeout; 57014
// statement_timeout; 25006 read-only transaction (a standby, or a primary demoted under us);
// 40001 and 40P01 serialization failure and deadlock, once Transfer's retries are spent; 55P03
// lock not available; 58 system errors (I/O).
func serverUnavailable(e *pgconn.PgError) bool {
	switch class := e.Code[:2]; {
	case class == "08", class == "53", class == "58", strings.HasPrefix(e.Code, "57P"):
		return true
	}
	switch e.Code {
	case "57014", "25006", "40001", "40P01", "55P03":
		return true
	}
	return false
}

// change runs fn in one transaction of the pool, as pgx.BeginFunc does, and tells a change that
// failed from one whose COMMIT was sent and not answered: the first changed nothing, the second
// may have been made (ErrChangeOutcomeUnknown), and is never answered "nothing was changed".
// (Transfer looks its own outcome up: a payment's retry must not pay twice. A change of limits,
// devices or a tier is read back by whoever asked for it.)
func (l *PostgresLedger) change(ctx context.Context, fn func(pgx.Tx) error) error {
	committing := false
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		committing = true // BeginFunc commits next
		return nil
	})
	var pgErr *pgconn.PgError
	switch {
	case err == nil || !committing, pgconn.SafeToRetry(err): // not committing, or COMMIT never sent
		return err
	case errors.Is(err, pgx.ErrTxCommitRollback), errors.As(err, &pgErr) && refused(pgErr):
		return err // the server answered: rolled back
	}
	return fmt.Errorf("%w: COMMIT sent, no answer: %w", ErrChangeOutcomeUnknown, err)
}

// refused reports whether the server answered a statement with an error of its own, which ends
// the statement (and, at COMMIT, rolls the transaction back), rather than ending the session
// (FATAL, PANIC: what became of a COMMIT then is unknown). By the unlocalized severity: the
// localized one is "ERRO" under a Portuguese lc_messages.
func refused(e *pgconn.PgError) bool {
	return cmp.Or(e.SeverityUnlocalized, e.Severity) == "ERROR"
}

// isDomain reports whether err is one of the ledger's own answers.
func isDomain(err error) bool {
	for _, d := range []error{ErrAccountNotFound, ErrKeyNotFound, ErrInsufficientFunds, ErrSameAccount,
		ErrIdempotencyConflict, ErrInvalidAmount, ErrIdempotencyKeyRequired, ErrNightLimitExceeded,
		ErrDailyLimitExceeded, ErrDeviceLimitExceeded, ErrInvalidLimits, ErrUnknownTier, ErrUnavailable, ErrOutcomeUnknown, ErrChangeOutcomeUnknown} {
		if errors.Is(err, d) {
			return true
		}
	}
	return false
}

// migrationLock is the advisory lock that serializes migrations across replicas starting at once.
const migrationLock = 0x706978_6c696d // "pixlim"

// migrate applies, in file-name order, every embedded migration not yet recorded in
// schema_migrations, each in its own transaction, under a session advisory lock: a second
// replica starting meanwhile waits, then finds nothing left to do. conn is the one OpenPostgres
// dials for it, without the pool's statement_timeout (a request's deadline, DB_TIMEOUT): waiting
// for the lock, or a migration on a busy server, may take longer, and ctx bounds it.
func migrate(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLock); err != nil {
		return fmt.Errorf("pix: migrate: lock: %w", err)
	}
	defer func() { // the session ends with the connection anyway: a second at most, even once ctx is done
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", migrationLock)
	}()

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("pix: migrate: %w", err)
	}
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	slices.Sort(files)
	for _, f := range files {
		name := strings.TrimPrefix(f, "migrations/")
		version, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("pix: migration %s: name must start with its number", name)
		}
		var done bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)", version).Scan(&done); err != nil {
			return fmt.Errorf("pix: migrate: %w", err)
		}
		if done {
			continue
		}
		sql, err := migrations.ReadFile(f)
		if err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
			return err
		})
		if err != nil {
			return fmt.Errorf("pix: migration %s: %w", name, err)
		}
	}
	return nil
}

// seed inserts the accounts and keys that are missing; existing rows, balances included, stay.
func seed(ctx context.Context, conn *pgx.Conn, accounts []Account) error {
	if len(accounts) == 0 {
		return nil
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, a := range accounts {
			if _, err := tx.Exec(ctx, `INSERT INTO accounts (id, name, document, password_hash, balance_cents)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
				a.ID, a.Name, a.Document, string(a.PasswordHash), a.OpeningCents); err != nil {
				return fmt.Errorf("pix: seed %s: %w", a.ID, err)
			}
			for _, k := range a.Keys {
				if _, err := tx.Exec(ctx, "INSERT INTO pix_keys (key, account_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", k, a.ID); err != nil {
					return fmt.Errorf("pix: seed %s: %w", a.ID, err)
				}
			}
		}
		return nil
	})
}

// AccountByDocument implements Ledger.
func (l *PostgresLedger) AccountByDocument(ctx context.Context, document string) (Account, error) {
	return l.account(ctx, "SELECT id, name, document, password_hash FROM accounts WHERE document = $1", document)
}

// account runs query, which selects one account's id, name, document and password hash by arg.
func (l *PostgresLedger) account(ctx context.Context, query, arg string) (Account, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var a Account
	var hash string
	err := l.pool.QueryRow(ctx, query, arg).Scan(&a.ID, &a.Name, &a.Document, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, ErrAccountNotFound
	}
	if err != nil {
		return Account{}, fmt.Errorf("pix: account: %w", unavailable(err))
	}
	a.PasswordHash = []byte(hash)
	return a, nil
}

// maxAttempts bounds the retries of a transfer that lost a serialization or deadlock race, or
// drew an end-to-end id already taken. Each retry is a fresh transaction: nothing half-done
// survives a failed attempt.
const maxAttempts = 5

// Transfer implements Ledger in one transaction: lock both accounts in id order (so two opposite
// transfers cannot deadlock), look for an earlier transfer with the idempotency key now that no
// other transfer of the payer can commit, debit only if the balance covers the amount,
// credit, record the transfer with its idempotency key and both entries; all of it commits or
// none does.
//
// Two deadlines, because a failure means two different things on either side of COMMIT. Up to
// COMMIT, every statement and retry shares the ledger's timeout, and a failure (ErrUnavailable)
// means nothing was changed: PostgreSQL rolls back a transaction that never committed. Once
// COMMIT is sent, the transaction may commit whatever the client does, so giving up on it and
// saying "nothing changed" could make a careful client pay twice. COMMIT gets a wait of its own
// (the ledger's timeout again, not the remains of the first), and its answer decides: done, or
// an error the server reported (rolled back, nothing changed). With no answer, the ledger asks
// once more, on another connection, whether the transfer is recorded under its idempotency key;
// only if that too fails to say yes is the outcome unknown (ErrOutcomeUnknown), and the
// client's retry with the same key finds the receipt or makes the transfer.
func (l *PostgresLedger) Transfer(ctx context.Context, r TransferRequest) (Receipt, error) {
	if err := r.valid(); err != nil {
		return Receipt{}, err
	}
	steps, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		receipt, err := l.transfer(steps, ctx, r)
		var pgErr *pgconn.PgError
		switch {
		case err == nil, errors.Is(err, ErrOutcomeUnknown):
			return receipt, err
		case errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "transfers_payer_id_idempotency_key_key":
			// A concurrent request with this idempotency key committed first: answer as its replay.
			receipt, err = l.replay(steps, r)
			return receipt, unavailable(err)
		case errors.As(err, &pgErr) && retryable(pgErr) && attempt < maxAttempts:
			backoff := time.Duration(attempt*attempt*(1+rand.IntN(5))) * time.Millisecond // jittered, growing
			select {
			case <-time.After(backoff):
				continue
			case <-steps.Done():
				return Receipt{}, unavailable(steps.Err())
			}
		}
		return Receipt{}, unavailable(err)
	}
}

// retryable: serialization failure, deadlock, or a duplicate end-to-end id.
func retryable(e *pgconn.PgError) bool {
	return e.Code == "40001" || e.Code == "40P01" || e.Code == "23505" && e.ConstraintName == "transfers_pkey"
}

// LongestTransfer is the longest a Transfer may take: the statements' deadline, COMMIT's and
// the look-up that asks for an unknown outcome. A server answering PIX requests gives its
// responses at least this long.
func (l *PostgresLedger) LongestTransfer() time.Duration { return LongestTransfer(l.timeout) }

// LongestTransfer is PostgresLedger.LongestTransfer for a ledger of the given timeout.
func LongestTransfer(timeout time.Duration) time.Duration { return 2*timeout + outcomeWait(timeout) }

// outcomeWait bounds the look-up that asks whether a transfer whose COMMIT went unanswered was
// recorded: a second at most, as it only turns an unknown outcome into a known one.
func outcomeWait(timeout time.Duration) time.Duration { return min(timeout, time.Second) }

// transfer is one attempt of Transfer: its statements under steps, its COMMIT under a wait of
// its own that ctx's cancellation does not cut short (a client that left does not make the
// outcome unknown).
//
// The transaction is begun in its first round trip (statements), on a connection of its own:
// pgx.Tx would spend one on BEGIN alone. The connection ends as pgx.Tx leaves one: closed when
// COMMIT or ROLLBACK went unanswered (its session's end decides the transaction), and given back
// before the look-up of an unknown outcome, which needs one of the pool's.
func (l *PostgresLedger) transfer(steps, ctx context.Context, r TransferRequest) (Receipt, error) {
	conn, err := l.pool.Acquire(steps)
	if err != nil {
		return Receipt{}, err
	}
	receipt, replayed, err := l.statements(steps, conn, r)
	if err != nil || replayed {
		rollback(steps, conn) // a replay wrote nothing: nothing to commit
		conn.Release()
		return receipt, err
	}
	commit, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	tag, err := conn.Exec(commit, "commit") // as pgx.Tx.Commit sends it: a simple query
	switch {
	case err == nil && tag.String() == "ROLLBACK":
		err = pgx.ErrTxCommitRollback // the transaction had failed: COMMIT rolled it back
	case err != nil && conn.Conn().PgConn().TxStatus() != 'I':
		_ = conn.Conn().Close(commit) // as pgx.Tx.Commit does
	}
	conn.Release() // a closed connection is dropped, not pooled
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return receipt, nil
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return Receipt{}, fmt.Errorf("%w: the transaction was rolled back at commit", ErrUnavailable)
	case errors.As(err, &pgErr) && refused(pgErr):
		return Receipt{}, err // the server refused COMMIT and rolled back; Transfer classifies it
	}
	// No answer, or the session ended (FATAL): the transaction may have committed.
	return l.outcomeOf(context.WithoutCancel(ctx), r, err)
}

// rollback ends a transaction that failed before COMMIT, within the statements' deadline
// (steps), so that a Transfer stays within LongestTransfer. If that has passed, or the rollback
// cannot be sent in time, the connection is closed instead, and the server rolls back when the
// session ends.
func rollback(steps context.Context, conn *pgxpool.Conn) {
	if steps.Err() == nil {
		if _, err := conn.Exec(steps, "rollback"); err == nil {
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeWait) // a Terminate message into the socket's buffer
	defer cancel()
	_ = conn.Conn().Close(ctx) // its transaction ends with its session
}

// closeWait bounds the close of a connection whose transaction failed: writing its Terminate.
const closeWait = 50 * time.Millisecond

// outcomeOf learns, if it can, the outcome of r whose COMMIT went unanswered (commitErr): the
// receipt if the transfer is recorded under its idempotency key, else ErrOutcomeUnknown. Not
// finding it proves nothing: the COMMIT may still be on its way, or waiting in the server.
func (l *PostgresLedger) outcomeOf(ctx context.Context, r TransferRequest, commitErr error) (Receipt, error) {
	ctx, cancel := context.WithTimeout(ctx, outcomeWait(l.timeout))
	defer cancel()
	receipt, found, err := findReplay(ctx, l.pool, r)
	if found && err == nil {
		receipt.Replayed = false // the COMMIT this request sent made it
		return receipt, nil
	}
	return Receipt{}, fmt.Errorf("%w: COMMIT sent, no answer (%w); look-up: found %t, %v", ErrOutcomeUnknown, commitErr, found, err)
}

// statements begins a transaction on conn and runs one attempt's statements, up to COMMIT, in
// two round trips (three when checkLimits asks the sums again): each sends at once what needs
// nothing from the others (a pgx.Batch), and each depends on the locks the one before took. replayed reports that the request's
// idempotency key was already recorded: receipt is then the earlier one, and nothing was written.
//
//  1. BEGIN; the payer's and the payee's rows locked, in id order; then, under the locks, the
//     request's idempotency key looked up (a concurrent request with this key that committed
//     while this one waited is answered as its replay, not judged against the balance it spent,
//     and a replay is answered even if its key has since left its account: a replay, a miss and
//     a payment to oneself take the locks too, and wait behind the payer's transfers in
//     flight), the payer's
//     devices and money limits read, and what it sent in the periods its limits count (guessed:
//     checkLimits asks again, in a round trip of its own, for a payer whose night starts at
//     another time, or when a period began while this one waited for the locks);
//  2. the money moved and the transfer recorded, in one statement that moves nothing when the
//     balance is short.
//
// Every time a transfer is judged and stamped at is the ledger's clock, the database's (at), never
// the replica's: the device is judged registered as of just before the transfer's own time
// (now), on the strict side, and now is read once the locks are held, so that one payer's
// transfers, which the locks put in order, are stamped in that order, whichever replica sends
// them. Only the guess of the periods (asked) is the replica's.
func (l *PostgresLedger) statements(ctx context.Context, conn *pgxpool.Conn, r TransferRequest) (receipt Receipt, replayed bool, err error) {
	var prior replayRow
	var locked []lockedAccount
	var registered bool
	var stored accountLimits
	asked := l.now().UTC().Truncate(time.Microsecond)
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue(`SELECT a.id, a.name, a.document, coalesce(a.id = (SELECT account_id FROM pix_keys WHERE key = $2), false)
		FROM accounts a WHERE a.id = $1 OR a.id = (SELECT account_id FROM pix_keys WHERE key = $2)
		ORDER BY a.id FOR UPDATE`, r.From, r.ToKey).Query(func(rows pgx.Rows) error {
		var err error
		locked, err = pgx.CollectRows(rows, pgx.RowToStructByPos[lockedAccount])
		return err
	})
	prior.queue(b, r)
	queueSettings(b, r.From, r.Device, l.at(), &registered, &stored)
	var now time.Time // the transfer's time: the ledger's clock, once the locks are held
	b.Queue("SELECT coalesce($1::timestamptz, clock_timestamp())", l.at()).QueryRow(func(row pgx.Row) error { return row.Scan(&now) })
	// What the payer sent, in the periods of a night that starts when the rules' nights do: the
	// limits in force, read in this same batch, confirm the guess, or checkLimits asks again.
	guess := sentIn{w: l.window(asked, l.rules.Night.Start)}
	b.Queue(sentSQL, r.From, guess.w.night, guess.w.day, guess.w.since).QueryRow(guess.scan)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return Receipt{}, false, err
	}
	if rec, found, err := prior.receipt(r); err != nil || found {
		return rec, found, err
	}
	payer, payee, err := parties(locked, r.From)
	if err != nil {
		return Receipt{}, false, err
	}
	now = now.UTC()
	if err := l.checkLimits(ctx, conn, r, payer.Document, payee.Document, registered, stored, now, guess); err != nil {
		return Receipt{}, false, err
	}
	receipt, err = l.move(ctx, conn, r, payer, payee, now, registered)
	return receipt, false, err
}

// settingsSQL is, in one statement, whether a device the payer registered is r's (and its
// registration no longer pending at a time), and what the payer set of its money limits,
// pending increases included.
const settingsSQL = `SELECT
		EXISTS (SELECT 1 FROM devices WHERE account_id = $1 AND device_id = $2
			AND (pending_until IS NULL OR pending_until <= coalesce($3::timestamptz, clock_timestamp()))),
		l.night_limit_cents, l.day_limit_cents, l.night_start,
		coalesce(p.fields, '{}'), coalesce(p.vals, '{}'), coalesce(p.effective, '{}')
	FROM (SELECT 1) one
	LEFT JOIN account_limits l ON l.account_id = $1
	LEFT JOIN (SELECT array_agg(field) fields, array_agg(value) vals, array_agg(effective_at) effective
		FROM pending_limits WHERE account_id = $1) p ON true`

// queueSettings queues settingsSQL for account and device ("" for none) at t (at's, or nil) into
// b, filling registered and limits.
func queueSettings(b *pgx.Batch, account, device string, t any, registered *bool, limits *accountLimits) {
	b.Queue(settingsSQL, account, device, t).QueryRow(func(row pgx.Row) error {
		var night, day, start *int64
		var fields []string
		var values []int64
		var effective []time.Time
		if err := row.Scan(registered, &night, &day, &start, &fields, &values, &effective); err != nil {
			return err
		}
		*registered = *registered && device != ""
		*limits = limitsOf(night, day, start, fields, values, effective)
		return nil
	})
}

// lockedAccount is an account row a transfer locked; Payee says the PIX key is its.
type lockedAccount struct {
	ID, Name, Document string
	Payee              bool
}

// parties are the payer and the payee among the rows a transfer locked, or the error of a
// transfer they do not allow: no account owns the key (ErrKeyNotFound, or ErrAccountNotFound
// when the payer's account does not exist either: a valid token for an account since removed is
// an authentication failure, whatever key it names), the key is the payer's own, or the payer is
// gone.
func parties(locked []lockedAccount, from string) (payer, payee lockedAccount, err error) {
	var found [2]bool
	for _, a := range locked {
		if a.Payee {
			payee, found[1] = a, true
		}
		if a.ID == from {
			payer, found[0] = a, true
		}
	}
	switch {
	case !found[1] && !found[0]:
		return payer, payee, ErrAccountNotFound
	case !found[1]:
		return payer, payee, ErrKeyNotFound
	case payee.ID == from:
		return payer, payee, ErrSameAccount
	case !found[0]:
		return payer, payee, ErrAccountNotFound
	}
	return payer, payee, nil
}

// checkLimits applies the money limits (Rules) under the payer's row lock, which the transaction
// holds: no other transfer of the payer can commit between the sums and this transfer, so
// concurrent transfers can never sum past a limit. guess is what the payer sent in the periods
// statements guessed; asked again here when the periods of the limits in force at now differ.
func (l *PostgresLedger) checkLimits(ctx context.Context, q querier, r TransferRequest, payerDocument, payeeDocument string,
	registered bool, stored accountLimits, now time.Time, guess sentIn) error {
	facts := transferFacts{now: now, amount: r.AmountCents, betweenPersons: betweenPersons(payerDocument, payeeDocument),
		deviceRegistered: registered, limits: l.rules.inForce(stored, now)}
	s := guess
	if w := l.window(now, facts.limits.NightStart); !w.same(guess.w) {
		s = sentIn{w: w}
		if err := s.scan(q.QueryRow(ctx, sentSQL, r.From, w.night, w.day, w.since)); err != nil {
			return err
		}
	}
	return l.rules.check(facts, s.s)
}

// window is the periods the money limits count at now for a night that starts at start: since
// tonight's night began (endOfTime by day: nothing counts as tonight's), since the day began,
// and the earlier of the two.
type window struct{ night, day, since time.Time }

// endOfTime is later than every transfer.
func endOfTime() time.Time { return time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC) }

// same says whether w and o are the same periods.
func (w window) same(o window) bool {
	return w.night.Equal(o.night) && w.day.Equal(o.day) && w.since.Equal(o.since)
}

func (l *PostgresLedger) window(now time.Time, start time.Duration) window {
	night, day := l.rules.periods(now, start)
	if night.IsZero() {
		night = endOfTime() // by day nothing counts as tonight's
	}
	since := day
	if night.Before(day) {
		since = night
	}
	return window{night: night, day: day, since: since}
}

// sentSQL is what a payer sent in a window: tonight to other persons (the payee's document
// tells a person from a company), today, and today from devices it has not registered;
// transfers_payer_time makes it one index range scan.
const sentSQL = `SELECT
		coalesce(sum(t.amount_cents) FILTER (WHERE t.created_at >= $2 AND length(a.document) = 11
			AND a.document <> (SELECT document FROM accounts WHERE id = $1)), 0),
		coalesce(sum(t.amount_cents) FILTER (WHERE t.created_at >= $3), 0),
		coalesce(sum(t.amount_cents) FILTER (WHERE t.created_at >= $3 AND NOT t.from_registered_device), 0)
	FROM transfers t JOIN accounts a ON a.id = t.payee_id WHERE t.payer_id = $1 AND t.created_at >= $4`

// sentIn is what a payer sent in a window.
type sentIn struct {
	w window
	s sent
}

func (s *sentIn) scan(row pgx.Row) error { return row.Scan(&s.s.night, &s.s.day, &s.s.unregistered) }

// collectAudit reads admin_audit rows.
func collectAudit(rows pgx.Rows) ([]AuditRecord, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditRecord, error) {
		var r AuditRecord
		err := row.Scan(&r.At, &r.Actor, &r.Action, &r.Status, &r.Policy, &r.Key, &r.Before, &r.After, &r.Outcome, &r.Request, &r.Calls)
		r.At = r.At.UTC()
		return r, err
	})
}

// loadLimits reads what an account set and its pending increases (settingsSQL, with no device).
func loadLimits(ctx context.Context, q pgx.Tx, account string) (accountLimits, error) {
	var registered bool
	var a accountLimits
	b := &pgx.Batch{}
	queueSettings(b, account, "", nil, &registered, &a)
	return a, q.SendBatch(ctx, b).Close()
}

// limitsOf is what an account set (night, day, start: nil where it set nothing) and its pending
// increases (field, value, effective time, one of each per increase), as the database keeps them.
func limitsOf(night, day, start *int64, fields []string, values []int64, effective []time.Time) accountLimits {
	a := accountLimits{night: night, day: day, pending: map[string]PendingLimit{}}
	if start != nil {
		d := time.Duration(*start) * time.Minute
		a.start = &d
	}
	for i, f := range fields {
		p := PendingLimit{Field: f, Value: values[i], EffectiveAt: effective[i].UTC()}
		if f == FieldNightStart {
			p.Value = int64(time.Duration(p.Value) * time.Minute)
		}
		a.pending[f] = p
	}
	return a
}

// storeLimits writes what an account set and its pending increases, replacing what was there.
func storeLimits(ctx context.Context, tx pgx.Tx, account string, a accountLimits) error {
	var start *int64
	if a.start != nil {
		m := int64(*a.start / time.Minute)
		start = &m
	}
	if _, err := tx.Exec(ctx, `INSERT INTO account_limits (account_id, night_limit_cents, day_limit_cents, night_start)
		VALUES ($1, $2, $3, $4) ON CONFLICT (account_id) DO UPDATE
		SET night_limit_cents = $2, day_limit_cents = $3, night_start = $4`, account, a.night, a.day, start); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "DELETE FROM pending_limits WHERE account_id = $1", account); err != nil {
		return err
	}
	for _, p := range a.pending {
		v := p.Value
		if p.Field == FieldNightStart {
			v = int64(time.Duration(v) / time.Minute)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO pending_limits (account_id, field, value, effective_at) VALUES ($1, $2, $3, $4)",
			account, p.Field, v, p.EffectiveAt); err != nil {
			return err
		}
	}
	return nil
}

// Account implements Ledger.
func (l *PostgresLedger) Account(ctx context.Context, id string) (Account, error) {
	return l.account(ctx, "SELECT id, name, document, password_hash FROM accounts WHERE id = $1", id)
}

// Limits implements Ledger.
// A read takes no lock: a read-only transaction's snapshot of the account's limits, which a flood
// of reads cannot make transfers wait for (they take the account's row lock).
func (l *PostgresLedger) Limits(ctx context.Context, accountID string) (MoneyLimits, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var out MoneyLimits
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM accounts WHERE id = $1)", accountID).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return ErrAccountNotFound
		}
		stored, err := loadLimits(ctx, tx, accountID)
		if err != nil {
			return err
		}
		now, err := l.clock(ctx, tx) // after the limits' read: no change it saw is later
		if err != nil {
			return err
		}
		out = l.rules.inForce(stored, now)
		return nil
	})
	if err != nil {
		return MoneyLimits{}, fmt.Errorf("pix: limits: %w", unavailable(err))
	}
	return out, nil
}

// SetLimits implements Ledger.
func (l *PostgresLedger) SetLimits(ctx context.Context, accountID string, c MoneyLimitsChange) (MoneyLimits, error) {
	return l.changeLimits(ctx, accountID, func(a accountLimits, now time.Time) (accountLimits, bool, error) {
		changed, err := l.rules.change(a, c, now)
		return changed, true, err
	})
}

// CancelPendingLimits implements Ledger.
func (l *PostgresLedger) CancelPendingLimits(ctx context.Context, accountID string) (MoneyLimits, error) {
	return l.changeLimits(ctx, accountID, func(a accountLimits, now time.Time) (accountLimits, bool, error) {
		a = a.settle(now) // what is due has applied: only what is not yet is cancelled
		a.pending = nil
		return a, true, nil
	})
}

// lockedAtSQL locks an account's row and reads the ledger's clock (at's $2) once the lock is
// held, in one round trip: read in the locking query itself, clock_timestamp() would be taken
// before a wait for the lock (PostgreSQL computes the row below its lock, and again after the
// wait only when the holder updated the row), and a change that waited behind another could
// carry an earlier time than the one it waited for. It returns had_registered_device beside it.
const lockedAtSQL = `SELECT locked.had, coalesce($2::timestamptz, clock_timestamp())
	FROM (SELECT had_registered_device AS had FROM accounts WHERE id = $1 FOR UPDATE) locked`

// changeLimits runs change over an account's limits in one transaction under the account's row
// lock (transfers take it too, so a transfer sees a change whole or not at all), storing them
// when change says so, and returns the limits in force.
func (l *PostgresLedger) changeLimits(ctx context.Context, account string, change func(accountLimits, time.Time) (accountLimits, bool, error)) (MoneyLimits, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var out MoneyLimits
	err := l.change(ctx, func(tx pgx.Tx) error {
		var now time.Time // the ledger's clock once the lock is held (lockedAtSQL)
		if err := tx.QueryRow(ctx, lockedAtSQL, account, l.at()).Scan(new(bool), &now); errors.Is(err, pgx.ErrNoRows) {
			return ErrAccountNotFound
		} else if err != nil {
			return err
		}
		stored, err := loadLimits(ctx, tx, account)
		if err != nil {
			return err
		}
		now = now.UTC()
		changed, write, err := change(stored, now)
		if err != nil {
			return err
		}
		if write {
			if err := storeLimits(ctx, tx, account, changed); err != nil {
				return err
			}
		}
		out = l.rules.inForce(changed, now)
		return nil
	})
	if err != nil {
		return MoneyLimits{}, fmt.Errorf("pix: limits: %w", unavailable(err))
	}
	return out, nil
}

// move moves the money and records the transfer, in one statement: the payer's balance taken
// (only if it holds the amount: ErrInsufficientFunds otherwise, and nothing below runs), the
// payee's given, the transfer row (the idempotency record) and its two statement entries, the
// payer's first. It returns the receipt.
func (l *PostgresLedger) move(ctx context.Context, tx querier, r TransferRequest, payer, payee lockedAccount, now time.Time, registered bool) (Receipt, error) {
	id := NewEndToEndID(now)
	var balance int64
	err := tx.QueryRow(ctx, `WITH payer AS (
			UPDATE accounts SET balance_cents = balance_cents - $3 WHERE id = $1 AND balance_cents >= $3 RETURNING balance_cents),
		payee AS (
			UPDATE accounts SET balance_cents = balance_cents + $3 WHERE id = $2 AND EXISTS (SELECT FROM payer)),
		transfer AS (
			INSERT INTO transfers (end_to_end_id, payer_id, payee_id, to_key, amount_cents, description, idempotency_key,
				payer_balance_after, created_at, from_registered_device)
			SELECT $4, $1, $2, $5, $3, $6, $7, balance_cents, $8, $9 FROM payer),
		entries AS (
			INSERT INTO entries (account_id, end_to_end_id, direction, amount_cents, counterparty, description, created_at)
			SELECT e.account, $4, e.direction, $3, e.counterparty, $6, $8 FROM payer,
				(VALUES (1, $1::text, 'out', $10::text), (2, $2::text, 'in', $11::text)) AS e(n, account, direction, counterparty)
			ORDER BY e.n)
		SELECT balance_cents FROM payer`,
		r.From, payee.ID, r.AmountCents, id, r.ToKey, r.Description, r.IdempotencyKey, now, registered, payee.Name, payer.Name).Scan(&balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return Receipt{}, ErrInsufficientFunds
	}
	if err != nil {
		return Receipt{}, err // 22003 numeric overflow: unreachable while money is only moved
	}
	return Receipt{EndToEndID: id, AmountCents: r.AmountCents, BalanceCents: balance, ToKey: r.ToKey, ToName: payee.Name, CreatedAt: now}, nil
}

// replay answers a request whose idempotency key is already recorded.
func (l *PostgresLedger) replay(ctx context.Context, r TransferRequest) (Receipt, error) {
	receipt, found, err := findReplay(ctx, l.pool, r)
	if err == nil && !found {
		err = errors.New("pix: idempotency record vanished")
	}
	return receipt, err
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// replaySQL is the transfer recorded under a payer's idempotency key, and its payee's name.
const replaySQL = `SELECT t.end_to_end_id, t.to_key, t.amount_cents, t.description, t.payer_balance_after, t.created_at, a.name
	FROM transfers t JOIN accounts a ON a.id = t.payee_id WHERE t.payer_id = $1 AND t.idempotency_key = $2`

// replayRow is what replaySQL found, if anything.
type replayRow struct {
	found           bool
	rec             Receipt
	amount          int64
	desc, payeeName string
}

func (p *replayRow) scan(row pgx.Row) error {
	err := row.Scan(&p.rec.EndToEndID, &p.rec.ToKey, &p.amount, &p.desc, &p.rec.BalanceCents, &p.rec.CreatedAt, &p.payeeName)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	p.found = err == nil
	return err
}

// queue queues the look-up of r's idempotency key into b.
func (p *replayRow) queue(b *pgx.Batch, r TransferRequest) {
	b.Queue(replaySQL, r.From, r.IdempotencyKey).QueryRow(p.scan)
}

// receipt is the receipt of the transfer found, if r is the same request as it:
// ErrIdempotencyConflict if not.
func (p *replayRow) receipt(r TransferRequest) (Receipt, bool, error) {
	if !p.found {
		return Receipt{}, false, nil
	}
	if p.rec.ToKey != r.ToKey || p.amount != r.AmountCents || p.desc != r.Description {
		return Receipt{}, true, ErrIdempotencyConflict
	}
	rec := p.rec
	rec.AmountCents, rec.ToName, rec.CreatedAt, rec.Replayed = p.amount, p.payeeName, rec.CreatedAt.UTC(), true
	return rec, true, nil
}

// findReplay looks up the transfer recorded under r's idempotency key: its receipt if r is the
// same request, ErrIdempotencyConflict if not.
func findReplay(ctx context.Context, q querier, r TransferRequest) (Receipt, bool, error) {
	var p replayRow
	if err := p.scan(q.QueryRow(ctx, replaySQL, r.From, r.IdempotencyKey)); err != nil {
		return Receipt{}, false, err
	}
	return p.receipt(r)
}

// LookupKey implements Ledger.
func (l *PostgresLedger) LookupKey(ctx context.Context, key string) (Payee, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	p := Payee{Key: key}
	err := l.pool.QueryRow(ctx, `SELECT a.name, a.document FROM pix_keys k JOIN accounts a ON a.id = k.account_id WHERE k.key = $1`, key).
		Scan(&p.Name, &p.Document)
	if errors.Is(err, pgx.ErrNoRows) {
		return Payee{}, ErrKeyNotFound
	}
	if err != nil {
		return Payee{}, fmt.Errorf("pix: lookup: %w", unavailable(err))
	}
	return p, nil
}

// Statement implements Ledger from one snapshot, so the balance and the entries agree.
func (l *PostgresLedger) Statement(ctx context.Context, accountID string, limit int) (Statement, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	st := Statement{AccountID: accountID, Entries: []Entry{}}
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, "SELECT balance_cents FROM accounts WHERE id = $1", accountID).Scan(&st.BalanceCents)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrAccountNotFound
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT end_to_end_id, direction, amount_cents, counterparty, description, created_at
			FROM entries WHERE account_id = $1 ORDER BY created_at DESC, seq DESC LIMIT $2`, accountID, max(limit, 0))
		if err != nil {
			return err
		}
		st.Entries, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Entry, error) {
			var e Entry
			err := row.Scan(&e.EndToEndID, &e.Direction, &e.AmountCents, &e.Counterparty, &e.Description, &e.CreatedAt)
			e.CreatedAt = e.CreatedAt.UTC()
			return e, err
		})
		return err
	})
	if err != nil {
		return Statement{}, unavailable(err)
	}
	return st, nil
}
