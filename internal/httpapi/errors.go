package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
)

// Code is an error code of the contract: the "error" member of every error body. Its status is
// codes' alone.
type Code string

// The contract's error codes.
const (
	CodeInvalidRequest          Code = "invalid_request"
	CodeIdempotencyKeyRequired  Code = "idempotency_key_required"
	CodeInvalidCredentials      Code = "invalid_credentials"
	CodeUnauthorized            Code = "unauthorized"
	CodeKeyNotFound             Code = "key_not_found"
	CodeNotFound                Code = "not_found"
	CodeMethodNotAllowed        Code = "method_not_allowed"
	CodeIdempotencyConflict     Code = "idempotency_conflict"
	CodeRequestTooLarge         Code = "request_too_large"
	CodeUnsupportedMediaType    Code = "unsupported_media_type"
	CodeInsufficientFunds       Code = "insufficient_funds"
	CodeSameAccount             Code = "same_account"
	CodeNightLimitExceeded      Code = "night_limit_exceeded"
	CodeDailyLimitExceeded      Code = "daily_limit_exceeded"
	CodeDeviceLimitExceeded     Code = "device_limit_exceeded"
	CodeDeviceNotRegistered     Code = "device_not_registered"
	CodeRateLimitExceeded       Code = "rate_limit_exceeded"
	CodeRateLimiterUnavailable  Code = "rate_limiter_unavailable"
	CodeClientClosedRequest     Code = "client_closed_request"
	CodeInternal                Code = "internal_error"
	CodeLedgerUnavailable       Code = "ledger_unavailable"
	CodeLedgerBusy              Code = "ledger_busy"
	CodeTransferOutcomeUnknown  Code = "transfer_outcome_unknown"
	CodeChangeOutcomeUnknown    Code = "change_outcome_unknown"
	CodeLookupCapacityExhausted Code = "lookup_capacity_exhausted"
	CodeLoginBusy               Code = "login_busy"
)

// codes is the one table of the contract's errors: each code's status, and the message a person
// reads when the error brings none of its own.
var codes = map[Code]struct {
	status  int
	message string
}{
	CodeInvalidRequest:         {http.StatusBadRequest, "invalid request"},
	CodeIdempotencyKeyRequired: {http.StatusBadRequest, "a PIX needs an Idempotency-Key header (1-64 of A-Z a-z 0-9 _ -), the same on every retry of one transfer"},
	CodeInvalidCredentials:     {http.StatusUnauthorized, "invalid document or password"},
	CodeUnauthorized:           {http.StatusUnauthorized, auth.ErrUnauthorized.Error()},
	CodeKeyNotFound:            {http.StatusNotFound, "no account has this PIX key"},
	CodeNotFound:               {http.StatusNotFound, "no such route"},
	CodeMethodNotAllowed:       {http.StatusMethodNotAllowed, "method not allowed"},
	CodeIdempotencyConflict:    {http.StatusConflict, pix.ErrIdempotencyConflict.Error()},
	CodeRequestTooLarge:        {http.StatusRequestEntityTooLarge, "request body too large"},
	CodeUnsupportedMediaType:   {http.StatusUnsupportedMediaType, "Content-Type must be application/json"},
	CodeInsufficientFunds:      {http.StatusUnprocessableEntity, pix.ErrInsufficientFunds.Error()},
	CodeSameAccount:            {http.StatusUnprocessableEntity, pix.ErrSameAccount.Error()},
	CodeNightLimitExceeded:     {http.StatusUnprocessableEntity, pix.ErrNightLimitExceeded.Error()},
	CodeDailyLimitExceeded:     {http.StatusUnprocessableEntity, pix.ErrDailyLimitExceeded.Error()},
	CodeDeviceLimitExceeded:    {http.StatusUnprocessableEntity, pix.ErrDeviceLimitExceeded.Error()},
	CodeDeviceNotRegistered:    {http.StatusForbidden, "this device is not registered for PIX: only a registered device may do this"},
	CodeRateLimitExceeded:      {http.StatusTooManyRequests, "too many requests; retry after the time given"},
	CodeRateLimiterUnavailable: {http.StatusTooManyRequests, "the rate limiter cannot decide right now; try again later"},
	CodeClientClosedRequest:    {499, "the client closed the request"}, // nginx's: logged as what it is rather than as a 500
	CodeInternal:               {http.StatusInternalServerError, "internal error"},
	CodeLedgerUnavailable:      {http.StatusServiceUnavailable, "the ledger did not answer in time; nothing was changed, try again later"},
	CodeLedgerBusy:             {http.StatusServiceUnavailable, "the ledger is busy (with payments, or with this account's other requests); nothing was changed, try again later"},
	CodeLookupCapacityExhausted: {http.StatusServiceUnavailable, "the bank's key look-up quota at the central bank's DICT is spent for now; " +
		"this is not your doing, try again after the time given"},
	CodeLoginBusy: {http.StatusServiceUnavailable, "the replica is checking as many passwords as it can at once; try again later"},
	CodeTransferOutcomeUnknown: {http.StatusServiceUnavailable, "the ledger did not confirm this transfer in time: it may have been made. " +
		"Retry with the same Idempotency-Key: if it was made, you get its receipt; if not, it is made once"},
	CodeChangeOutcomeUnknown: {http.StatusServiceUnavailable, "the change was sent but not confirmed in time: it may have been made. " +
		"Read it back before asking for it again"},
}

// Error is every error the API answers with, as benbjohnson/wtf does it: a Code, which alone
// decides the status (codes), a message for people, and the offending fields of a 400. Handlers
// return an *Error or a domain error; errorHandler maps the latter in one table (domainErrors)
// and writes every answer.
type Error struct {
	// Code is the contract's error code.
	Code Code
	// Message explains Code to a person; it never holds a secret or an identity. Empty: the
	// code's own message.
	Message string
	// Fields names, for an invalid_request, each offending field and why.
	Fields map[string]string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds, at least 1) and, in the
	// body, as retry_after_seconds.
	RetryAfter time.Duration
	// RemainingCents, when set, is what a money limit leaves (remaining_cents in the body).
	RemainingCents *int64
	// cause is what went wrong underneath, for the log; never sent.
	cause error
}

func (e *Error) Error() string {
	if e.cause != nil {
		return string(e.Code) + ": " + e.message() + ": " + e.cause.Error()
	}
	return string(e.Code) + ": " + e.message()
}

func (e *Error) Unwrap() error { return e.cause }

// message is the Error's message, or its code's.
func (e *Error) message() string {
	if e.Message != "" {
		return e.Message
	}
	return codes[e.Code].message
}

// shed says whether c answers a request shed on purpose (a busy ledger or login, the bank's
// look-up quota spent), which a client can send again without end, as it spends no quota: it is
// counted where decided, and neither logged as an error (errorHandler) nor one line each (edge).
func (c Code) shed() bool {
	return c == CodeLedgerBusy || c == CodeLookupCapacityExhausted || c == CodeLoginBusy
}

// status is the Error's HTTP status: its code's, or 500 for a code the table lacks (a bug).
func (e *Error) status() int {
	if c, ok := codes[e.Code]; ok {
		return c.status
	}
	return http.StatusInternalServerError
}

// invalid is a 400 invalid_request naming the offending fields.
func invalid(message string, fields map[string]string) *Error {
	return &Error{Code: CodeInvalidRequest, Message: message, Fields: fields}
}

// domainErrors maps the domain packages' errors to the contract's codes, in one place; an
// error's own text is the message when it says more than the code's (how much is left tonight).
var domainErrors = []struct {
	err     error
	code    Code
	ownText bool
}{
	{auth.ErrInvalidCredentials, CodeInvalidCredentials, false},
	{auth.ErrBusy, CodeLoginBusy, false},
	{auth.ErrUnauthorized, CodeUnauthorized, false},
	{pix.ErrAccountNotFound, CodeUnauthorized, false}, // a valid token for no account
	{pix.ErrKeyNotFound, CodeKeyNotFound, false},
	{pix.ErrInsufficientFunds, CodeInsufficientFunds, false},
	{pix.ErrSameAccount, CodeSameAccount, false},
	{pix.ErrIdempotencyConflict, CodeIdempotencyConflict, false},
	{pix.ErrNightLimitExceeded, CodeNightLimitExceeded, true},
	{pix.ErrDailyLimitExceeded, CodeDailyLimitExceeded, true},
	{pix.ErrDeviceLimitExceeded, CodeDeviceLimitExceeded, true},
	{pix.ErrDeviceNotRegistered, CodeDeviceNotRegistered, false},
	{pix.ErrDeviceNotFound, CodeNotFound, true},
	{pix.ErrUnavailable, CodeLedgerUnavailable, false},
	{pix.ErrLedgerBusy, CodeLedgerBusy, false},
	{pix.ErrOutcomeUnknown, CodeTransferOutcomeUnknown, false},
	{pix.ErrChangeOutcomeUnknown, CodeChangeOutcomeUnknown, false},
	{context.Canceled, CodeClientClosedRequest, false},
}

// echoCodes names the statuses Echo itself answers with (its router and body reader).
var echoCodes = map[int]Code{
	http.StatusNotFound:              CodeNotFound,
	http.StatusMethodNotAllowed:      CodeMethodNotAllowed,
	http.StatusRequestEntityTooLarge: CodeRequestTooLarge,
	http.StatusUnsupportedMediaType:  CodeUnsupportedMediaType,
}

// toError turns any error into the *Error to answer with. ledgerRetryAfter is the Retry-After of
// the ledger's 503s.
func toError(err error, ledgerRetryAfter time.Duration) *Error {
	if e, ok := err.(*Error); ok { // the common case, before errors.As moves e and he to the heap
		return e
	}
	var (
		e  *Error
		he *echo.HTTPError
	)
	if errors.As(err, &e) {
		return e
	}
	for _, d := range domainErrors {
		if errors.Is(err, d.err) {
			e := &Error{Code: d.code, cause: err}
			if d.ownText {
				e.Message = err.Error()
			}
			var left interface{ Remaining() int64 }
			if errors.As(err, &left) {
				v := left.Remaining()
				e.RemainingCents = &v
			}
			switch d.code {
			case CodeLedgerUnavailable, CodeTransferOutcomeUnknown, CodeChangeOutcomeUnknown:
				e.RetryAfter = ledgerRetryAfter
			case CodeLedgerBusy, CodeLoginBusy:
				e.RetryAfter = time.Second // a place frees as soon as a call (a comparison) ends
			}
			return e
		}
	}
	if errors.As(err, &he) {
		code, ok := echoCodes[he.Code]
		if !ok {
			code = CodeInvalidRequest
		}
		if he.Code >= 500 {
			code = CodeInternal
		}
		return &Error{Code: code, Message: fmt.Sprint(he.Message), cause: err}
	}
	return &Error{Code: CodeInternal, cause: err}
}

// errorBody is the JSON body of every error.
type errorBody struct {
	Error             Code              `json:"error"`
	Message           string            `json:"message"`
	Fields            map[string]string `json:"fields,omitempty"`
	RetryAfterSeconds int64             `json:"retry_after_seconds,omitempty"`
	RemainingCents    *int64            `json:"remaining_cents,omitempty"`
}

// appendPlain is the body as c.JSON writes it (encoding/json, and a newline), written without
// reflection when it is plain: no fields, no cents, and a code and message that need no escaping
// (most refusals). ok is false otherwise, and c.JSON writes it.
func (b errorBody) appendPlain() (out []byte, ok bool) {
	if b.Fields != nil || b.RemainingCents != nil || !plain(string(b.Error)) || !plain(b.Message) {
		return nil, false
	}
	out = make([]byte, 0, 64+len(b.Error)+len(b.Message))
	out = append(append(append(out, `{"error":"`...), b.Error...), `","message":"`...)
	out = append(append(out, b.Message...), '"')
	if b.RetryAfterSeconds != 0 {
		out = strconv.AppendInt(append(out, `,"retry_after_seconds":`...), b.RetryAfterSeconds, 10)
	}
	return append(out, "}\n"...), true
}

// plain says whether s is printable ASCII that encoding/json writes as it is: no quote,
// backslash, or <, > and & (which it escapes for HTML).
func plain(s string) bool {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// errorHandler is the one place where errors become HTTP responses.
func errorHandler(logger *slog.Logger, ledgerRetryAfter time.Duration) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		e := toError(err, ledgerRetryAfter)
		status := e.status()
		switch {
		case e.Code.shed():
			// Shed on purpose, and counted where decided (the bank's quota logged there too; a
			// busy login among the route's 503s): a line each at ERROR would bury the server's own
			// errors under a flood's.
		case e.Code == CodeLedgerUnavailable, e.Code == CodeTransferOutcomeUnknown, e.Code == CodeChangeOutcomeUnknown:
			logger.Error(string(e.Code), "route", c.Path(), "err", err)
		case status >= http.StatusInternalServerError:
			logger.Error("internal error", "route", c.Path(), "err", err)
		}
		h := c.Response().Header()
		switch e.Code {
		case CodeUnauthorized:
			h.Set(echo.HeaderWWWAuthenticate, "Bearer")
		case CodeRateLimiterUnavailable, CodeLookupCapacityExhausted:
			// No decision was made, or the bank's bucket made it, not the customer's to see: the
			// RateLimit headers of an earlier step of the request (a look-up's ask, answered before
			// Redis refused its charge, or the bank's bucket its own) would contradict the body,
			// and their Reset its Retry-After.
			for _, name := range rateLimitHeaders {
				delete(h, name)
			}
		}
		body := errorBody{Error: e.Code, Message: e.message(), Fields: e.Fields, RemainingCents: e.RemainingCents}
		if e.RetryAfter > 0 {
			body.RetryAfterSeconds = retrySeconds(e.RetryAfter)
			h["Retry-After"] = []string{strconv.FormatInt(body.RetryAfterSeconds, 10)} // canonical already
		}
		if c.Request().Method == http.MethodHead {
			err = c.NoContent(status)
		} else if b, plain := body.appendPlain(); plain {
			if len(h["Content-Type"]) == 0 { // as c.JSON sets it (only when unset), without canonicalizing
				h["Content-Type"] = []string{echo.MIMEApplicationJSON}
			}
			err = c.Blob(status, echo.MIMEApplicationJSON, b)
		} else {
			err = c.JSON(status, body)
		}
		if err != nil {
			logger.Warn("write error response", "err", err)
		}
	}
}
