package pixlimit

import _ "embed"

// OpenAPI is docs/openapi.yaml, the machine-readable contract of the public listener, as the API
// serves it (GET /openapi.yaml) and the tests check every response against it; OpenAPIAdmin is
// docs/openapi-admin.yaml, the support desk's.
var (
	//go:embed docs/openapi.yaml
	OpenAPI []byte
	//go:embed docs/openapi-admin.yaml
	OpenAPIAdmin []byte
)
