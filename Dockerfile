# Build the API statically: no cgo, no libc, paths trimmed, symbols stripped. The image holds the
# API alone: the demo (go run ./cmd/demo) drives a deployment from outside, and nothing a demo
# needs belongs in a real one.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN go build -trimpath -ldflags="-s -w" -o /out/api ./cmd/api

# Run it on distroless: no shell, no package manager, a non-root user (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/api /usr/local/bin/
USER nonroot:nonroot
EXPOSE 8080
# The image has no curl: the api binary asks its own /healthz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/usr/local/bin/api", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/api"]
