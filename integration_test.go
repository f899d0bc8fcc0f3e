package pixlimit_test

import (
	"crypto/rand"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/pixlimit/pixlimit/internal/app"
	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// fleet starts n replicas as separate HTTP servers over srv, each built by app.New as cmd/api
// builds one (its own client and Limiter, as separate processes would have), over one token
// secret and ledger, configured by env. It returns their clients and the fleet's token issuer.
func fleet(t testing.TB, srv *redistest.Server, ledger pix.Ledger, n int, env map[string]string) ([]*apitest.Client, *auth.Tokens) {
	t.Helper()
	return fleetAt(t, srv, ledger, n, env, apitest.PasswordCost)
}

// fleetAt is fleet with passwords compared at passwordCost: a test of what bcrypt's time does
// passes a real deployment's (auth.DefaultPasswordCost), with accounts hashed at it.
func fleetAt(t testing.TB, srv *redistest.Server, ledger pix.Ledger, n int, env map[string]string, passwordCost int) ([]*apitest.Client, *auth.Tokens) {
	t.Helper()
	env["NIGHT_LIMIT_CENTS"] = "0"                                                                                    // tests never depend on the hour they run at
	env["DAY_LIMIT_CENTS"], env["NEW_DEVICE_TRANSFER_LIMIT_CENTS"], env["NEW_DEVICE_DAY_LIMIT_CENTS"] = "0", "0", "0" // nor on the device
	env["REDIS_URL"] = "redis://" + srv.Addr()
	env["AUTH_SECRET"] = rand.Text() + rand.Text() // one for the fleet
	cfg, err := config.Load(config.Map(env))
	if err != nil {
		t.Fatal(err)
	}
	replicas := make([]*apitest.Client, n)
	var tokens *auth.Tokens
	for i := range replicas {
		r, err := app.New(t.Context(), cfg, app.Deps{Ledger: ledger, PasswordCost: passwordCost})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		hs := httptest.NewServer(r.Handler)
		t.Cleanup(hs.Close)
		replicas[i], tokens = &apitest.Client{T: t, Base: hs.URL}, r.Tokens
	}
	return replicas, tokens
}

func TestFleetLimitsHoldExactly(t *testing.T) {
	t.Parallel()
	ledger, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	// A generous budget: a loaded CI machine sometimes needs more than 100ms.
	// The rate limits alone: the in-flight limit, which also refuses PIX that overlap, has its
	// own test (throttle_test.go).
	replicas, _ := fleet(t, redistest.Start(t), ledger, 3, map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "REDIS_TIMEOUT": "1s",
		"PIX_CONCURRENCY": "0"})

	// A token from one replica works on every other.
	ana := replicas[0].Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
	before := replicas[1].Balance(ana)

	pix := apitest.Burst(replicas, 30, func(c *apitest.Client, i int) apitest.Response { return c.PIX(ana, "bruno@example.com", 100) })
	if pix[201] != 10 || pix[429] != 20 || len(pix) != 2 {
		t.Errorf("30 concurrent PIX over 3 replicas: %v, want exactly 10 × 201 and 20 × 429", pix)
	}
	if got, want := replicas[2].Balance(ana), before-10*100; got != want {
		t.Errorf("balance %d, want %d: exactly the admitted transfers moved money", got, want)
	}

	bruno := replicas[2].Token(apitest.Demo[1].Document, apitest.Demo[1].Password)
	st := apitest.Burst(replicas, 45, func(c *apitest.Client, i int) apitest.Response { return c.Statement(bruno) })
	if st[200] != 30 || st[429] != 15 {
		t.Errorf("45 concurrent statements over 3 replicas: %v, want exactly 30 × 200 and 15 × 429", st)
	}

	// The login's document key across the fleet: a botnet, one IP per guess, at Carla's CPF.
	byDoc := apitest.Burst(replicas, 20, func(c *apitest.Client, i int) apitest.Response {
		return c.Login(apitest.Demo[2].Document, "guess", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
	})
	if byDoc[401] != 5 || byDoc[429] != 15 {
		t.Errorf("20 guesses from 20 IPs over 3 replicas: %v, want exactly 5 × 401 and 15 × 429", byDoc)
	}
	// And its IP key: one IP, many documents.
	byIP := apitest.Burst(replicas, 25, func(c *apitest.Client, i int) apitest.Response {
		return c.Login(apitest.CPF(500+i), "guess", "X-Forwarded-For", "198.51.100.200")
	})
	if byIP[401] != 10 || byIP[429] != 15 {
		t.Errorf("25 documents from one IP over 3 replicas: %v, want exactly 10 × 401 and 15 × 429", byIP)
	}

	// A trusted device's own key: Diego's phone, stolen, guesses from 20 IPs at once.
	diego := replicas[0].Login(apitest.Demo[3].Document, apitest.Demo[3].Password, "X-Forwarded-For", "192.0.2.40")
	phone, _ := diego.JSON(t)["device_token"].(string)
	byDevice := apitest.Burst(replicas, 20, func(c *apitest.Client, i int) apitest.Response {
		return c.Login(apitest.Demo[3].Document, "guess", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", 100+i), "Device-Token", phone)
	})
	if phone == "" || byDevice[401] != 5 || byDevice[429] != 15 {
		t.Errorf("20 guesses with one device token over 3 replicas: %v, want exactly 5 × 401 and 15 × 429", byDevice)
	}
}
