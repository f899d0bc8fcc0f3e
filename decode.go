package pixlimit

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// invalidRequest is a 400 with the offending fields, each with why.
type invalidRequest struct {
	message string
	fields  map[string]string
}

func (e *invalidRequest) Error() string { return e.message }

func invalid(message string, fields map[string]string) error {
	return &invalidRequest{message: message, fields: fields}
}

// decodeJSON reads the request body into v strictly: JSON content type, one JSON object, no
// unknown fields, no trailing data, within the body limit. Every failure is a client error.
func decodeJSON(c echo.Context, v any) error {
	mt, _, err := mime.ParseMediaType(c.Request().Header.Get(echo.HeaderContentType))
	if err != nil || mt != echo.MIMEApplicationJSON {
		return echo.NewHTTPError(http.StatusUnsupportedMediaType, "Content-Type must be application/json")
	}
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("trailing data")
	}
	var (
		tooLarge  *http.MaxBytesError
		typeError *json.UnmarshalTypeError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooLarge):
		return echo.NewHTTPError(http.StatusRequestEntityTooLarge, "request body too large")
	case errors.Is(err, io.EOF):
		return invalid("request body is required", nil)
	case errors.As(err, &typeError) && typeError.Field != "":
		return invalid("invalid field", map[string]string{typeError.Field: "must be " + jsonKind(typeError.Type.Kind().String())})
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return invalid("unknown field", map[string]string{name: "unknown field"})
	}
	return invalid("request body is not a single JSON object", nil)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int64", "int":
		return "an integer (cents) within range"
	case "string":
		return "a string"
	}
	return "a " + goKind
}
