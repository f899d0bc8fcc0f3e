package pixlimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// statusClientClosedRequest is nginx's 499: logged as what it is rather than as a 500.
const statusClientClosedRequest = 499

// errorBody is the JSON body of every error but a 429 (ratelimit.ErrorBody).
type errorBody struct {
	Error   string            `json:"error"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
}

// errorHandler is the one place where errors become HTTP responses. ledgerRetryAfter is the
// Retry-After of a 503 ledger_unavailable: as long as the ledger call was given.
func errorHandler(logger *slog.Logger, ledgerRetryAfter time.Duration) echo.HTTPErrorHandler {
	retryAfter := strconv.FormatInt(int64(max(time.Second, ledgerRetryAfter.Round(time.Second))/time.Second), 10)
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		status, body := httpError(err)
		switch {
		case errors.Is(err, pix.ErrUnavailable):
			logger.Error("ledger unavailable", "route", c.Path(), "err", err)
			c.Response().Header().Set("Retry-After", retryAfter)
		case status >= http.StatusInternalServerError:
			logger.Error("internal error", "route", c.Path(), "err", err)
		}
		if status == http.StatusUnauthorized && !errors.Is(err, auth.ErrInvalidCredentials) {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, "Bearer")
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

func httpError(err error) (int, any) {
	var (
		inv *invalidRequest
		he  *echo.HTTPError
	)
	switch {
	case errors.Is(err, context.Canceled):
		// The client left before the answer; nobody reads it, and it is no server error.
		return statusClientClosedRequest, errorBody{Error: "client_closed_request", Message: "the client closed the request"}
	case errors.As(err, &inv):
		return http.StatusBadRequest, errorBody{"invalid_request", inv.message, inv.fields}
	case errors.Is(err, auth.ErrInvalidCredentials):
		return http.StatusUnauthorized, errorBody{Error: "invalid_credentials", Message: "invalid document or password"}
	case errors.Is(err, auth.ErrUnauthorized), errors.Is(err, pix.ErrAccountNotFound): // a token for no account
		return http.StatusUnauthorized, errorBody{Error: "unauthorized", Message: auth.ErrUnauthorized.Error()}
	case errors.Is(err, pix.ErrKeyNotFound):
		return http.StatusNotFound, errorBody{Error: "key_not_found", Message: "no account has this PIX key"}
	case errors.Is(err, pix.ErrInsufficientFunds):
		return http.StatusUnprocessableEntity, errorBody{Error: "insufficient_funds", Message: err.Error()}
	case errors.Is(err, pix.ErrSameAccount):
		return http.StatusUnprocessableEntity, errorBody{Error: "same_account", Message: err.Error()}
	case errors.Is(err, pix.ErrIdempotencyConflict):
		return http.StatusConflict, errorBody{Error: "idempotency_conflict", Message: err.Error()}
	case errors.Is(err, pix.ErrUnavailable):
		return http.StatusServiceUnavailable, errorBody{Error: "ledger_unavailable", Message: "the ledger did not answer in time; nothing was changed, try again later"}
	case errors.Is(err, pix.ErrInvalidAmount):
		return http.StatusBadRequest, errorBody{"invalid_request", "invalid field", map[string]string{"amount_cents": err.Error()}}
	case errors.As(err, &he):
		if body, ok := he.Message.(ratelimit.ErrorBody); ok {
			return he.Code, body
		}
		msg, _ := he.Message.(string)
		if msg == "" {
			msg = http.StatusText(he.Code)
		}
		code := map[int]string{
			http.StatusBadRequest:            "invalid_request",
			http.StatusNotFound:              "not_found",
			http.StatusMethodNotAllowed:      "method_not_allowed",
			http.StatusRequestEntityTooLarge: "request_too_large",
			http.StatusUnsupportedMediaType:  "unsupported_media_type",
		}[he.Code]
		if code == "" {
			if he.Code < 500 {
				code = "invalid_request"
			} else {
				code = "internal_error"
			}
		}
		return he.Code, errorBody{Error: code, Message: msg}
	}
	return http.StatusInternalServerError, errorBody{Error: "internal_error", Message: "internal error"}
}
