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

// Error is every error the API answers with, as benbjohnson/wtf does it: a code from the
// contract, which alone decides the status (statusOf), a message for people, and the offending
// fields of a 400. Handlers return an *Error or a domain error; errorHandler maps the latter in
// one table (domainErrors) and writes every answer.
type Error struct {
	// Code is the contract's error code: "invalid_request", "rate_limit_exceeded", ...
	Code string
	// Message explains Code to a person; it never holds a secret or an identity.
	Message string
	// Fields names, for an invalid_request, each offending field and why.
	Fields map[string]string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds, at least 1) and, in the
	// body, as retry_after_seconds.
	RetryAfter time.Duration
	// cause is what went wrong underneath, for the log; never sent.
	cause error
}

func (e *Error) Error() string {
	if e.cause != nil {
		return e.Code + ": " + e.Message + ": " + e.cause.Error()
	}
	return e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.cause }

// statusOf is the one code→status table.
var statusOf = map[string]int{
	"invalid_request":          http.StatusBadRequest,
	"idempotency_key_required": http.StatusBadRequest,
	"invalid_credentials":      http.StatusUnauthorized,
	"unauthorized":             http.StatusUnauthorized,
	"key_not_found":            http.StatusNotFound,
	"not_found":                http.StatusNotFound,
	"method_not_allowed":       http.StatusMethodNotAllowed,
	"idempotency_conflict":     http.StatusConflict,
	"request_too_large":        http.StatusRequestEntityTooLarge,
	"unsupported_media_type":   http.StatusUnsupportedMediaType,
	"insufficient_funds":       http.StatusUnprocessableEntity,
	"same_account":             http.StatusUnprocessableEntity,
	"night_limit_exceeded":     http.StatusUnprocessableEntity,
	"rate_limit_exceeded":      http.StatusTooManyRequests,
	"rate_limiter_unavailable": http.StatusTooManyRequests,
	"client_closed_request":    499, // nginx's: logged as what it is rather than as a 500
	"internal_error":           http.StatusInternalServerError,
	"ledger_unavailable":       http.StatusServiceUnavailable,
	"transfer_outcome_unknown": http.StatusServiceUnavailable,
}

// invalid is a 400 invalid_request naming the offending fields.
func invalid(message string, fields map[string]string) *Error {
	return &Error{Code: "invalid_request", Message: message, Fields: fields}
}

// domainErrors maps the domain packages' errors to the contract's, in one place.
var domainErrors = []struct {
	err     error
	code    string
	message string
}{
	{auth.ErrInvalidCredentials, "invalid_credentials", "invalid document or password"},
	{auth.ErrUnauthorized, "unauthorized", auth.ErrUnauthorized.Error()},
	{pix.ErrAccountNotFound, "unauthorized", auth.ErrUnauthorized.Error()}, // a valid token for no account
	{pix.ErrKeyNotFound, "key_not_found", "no account has this PIX key"},
	{pix.ErrInsufficientFunds, "insufficient_funds", pix.ErrInsufficientFunds.Error()},
	{pix.ErrSameAccount, "same_account", pix.ErrSameAccount.Error()},
	{pix.ErrIdempotencyConflict, "idempotency_conflict", pix.ErrIdempotencyConflict.Error()},
	{pix.ErrNightLimitExceeded, "night_limit_exceeded", ""}, // its message says how much is left tonight
	{pix.ErrUnavailable, "ledger_unavailable", "the ledger did not answer in time; nothing was changed, try again later"},
	{pix.ErrOutcomeUnknown, "transfer_outcome_unknown", "the ledger did not confirm this transfer in time: it may have been made. " +
		"Retry with the same Idempotency-Key: if it was made, you get its receipt; if not, it is made once"},
	{context.Canceled, "client_closed_request", "the client closed the request"},
}

// echoCodes names the statuses Echo itself answers with (its router and body reader).
var echoCodes = map[int]string{
	http.StatusNotFound:              "not_found",
	http.StatusMethodNotAllowed:      "method_not_allowed",
	http.StatusRequestEntityTooLarge: "request_too_large",
	http.StatusUnsupportedMediaType:  "unsupported_media_type",
}

// toError turns any error into the *Error to answer with. ledgerRetryAfter is the Retry-After of
// ledger_unavailable.
func toError(err error, ledgerRetryAfter time.Duration) *Error {
	var (
		e  *Error
		he *echo.HTTPError
	)
	if errors.As(err, &e) {
		return e
	}
	for _, d := range domainErrors {
		if errors.Is(err, d.err) {
			e := &Error{Code: d.code, Message: d.message, cause: err}
			if e.Message == "" {
				e.Message = err.Error()
			}
			if d.err == pix.ErrUnavailable || d.err == pix.ErrOutcomeUnknown {
				e.RetryAfter = ledgerRetryAfter
			}
			return e
		}
	}
	if errors.As(err, &he) {
		code, ok := echoCodes[he.Code]
		if !ok {
			code = "invalid_request"
		}
		if he.Code >= 500 {
			code = "internal_error"
		}
		return &Error{Code: code, Message: fmt.Sprint(he.Message), cause: err}
	}
	return &Error{Code: "internal_error", Message: "internal error", cause: err}
}

// errorBody is the JSON body of every error.
type errorBody struct {
	Error             string            `json:"error"`
	Message           string            `json:"message"`
	Fields            map[string]string `json:"fields,omitempty"`
	RetryAfterSeconds int64             `json:"retry_after_seconds,omitempty"`
}

// errorHandler is the one place where errors become HTTP responses.
func errorHandler(logger *slog.Logger, ledgerRetryAfter time.Duration) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		e := toError(err, ledgerRetryAfter)
		status, ok := statusOf[e.Code]
		if !ok {
			status = http.StatusInternalServerError
		}
		switch {
		case e.Code == "ledger_unavailable", e.Code == "transfer_outcome_unknown":
			logger.Error(e.Code, "route", c.Path(), "err", err)
		case status >= http.StatusInternalServerError:
			logger.Error("internal error", "route", c.Path(), "err", err)
		}
		h := c.Response().Header()
		if status == http.StatusUnauthorized && e.Code == "unauthorized" {
			h.Set(echo.HeaderWWWAuthenticate, "Bearer")
		}
		body := errorBody{Error: e.Code, Message: e.Message, Fields: e.Fields}
		if e.RetryAfter > 0 {
			body.RetryAfterSeconds = retrySeconds(e.RetryAfter)
			h.Set("Retry-After", strconv.FormatInt(body.RetryAfterSeconds, 10))
		}
		if c.Request().Method == http.MethodHead {
			err = c.NoContent(status)
		} else {
			err = c.JSON(status, body)
		}
		if err != nil {
			logger.Warn("write error response", "err", err)
		}
	}
}
