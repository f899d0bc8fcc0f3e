package pixlimit_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// BenchmarkLoginFlood: a botnet logs in up to 100 times a second for 12 s, each login from an address
// and with a CPF of its own (so each is within its keys and costs a bcrypt comparison), against
// one replica at a real deployment's bcrypt cost, over a real redis-server. Meanwhile, every half
// second, Ana pays, and five times each Diego logs in from his phone (its device token) and Carla
// from a device never seen. It reports what each got: the botnet's logins compared and answered
// login_busy (auth.Passwords compares one password per core at once), and Ana's, Diego's and
// Carla's answers. (The botnet's client shares the machine: it offers what it can, offered/s.)
// Run it once:
//
//	go test -run '^$' -bench LoginFlood -benchtime 1x .
func BenchmarkLoginFlood(b *testing.B) {
	accounts, err := pix.DemoAccounts(auth.DefaultPasswordCost)
	if err != nil {
		b.Fatal(err)
	}
	ledger, err := pix.NewMemoryLedger(accounts)
	if err != nil {
		b.Fatal(err)
	}
	replicas, _ := fleetAt(b, redistest.Start(b), ledger, 1, map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "PIX_LIMIT": "1000", "LOG_LEVEL": "error"},
		auth.DefaultPasswordCost)
	c := replicas[0]
	ana, diego, carla := apitest.Demo[0], apitest.Demo[3], apitest.Demo[2]
	pays := c.Token(ana.Document, ana.Password, "X-Forwarded-For", "192.0.2.1")
	phone, _ := c.Login(diego.Document, diego.Password, "X-Forwarded-For", "192.0.2.2").JSON(b)["device_token"].(string)

	var mu sync.Mutex
	got := map[string]int{} // "who status code": how many
	count := func(what string) { mu.Lock(); got[what]++; mu.Unlock() }
	tally := func(who string, r apitest.Response) {
		code, _ := r.JSON(b)["error"].(string)
		count(fmt.Sprint(who, " ", r.Status, " ", code))
	}
	stop := make(chan struct{})
	flooding := loginFlood(c.Base, count, stop)
	time.Sleep(2 * time.Second) // the flood at its height
	var paid []time.Duration
	for i := range 20 {
		if i%4 == 0 {
			tally("diego", c.Login(diego.Document, diego.Password, "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", 10+i), "Device-Token", phone))
			tally("carla", c.Login(carla.Document, carla.Password, "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", 40+i)))
		}
		p := c.PIX(pays, "bruno@example.com", 1)
		tally("ana-pix", p)
		paid = append(paid, p.Took)
		time.Sleep(500 * time.Millisecond)
	}
	close(stop)
	sent, took := flooding()
	slices.Sort(paid)
	b.ReportMetric(float64(sent)/took.Seconds(), "offered/s")
	b.ReportMetric(float64(got["flood 401 invalid_credentials"])/took.Seconds(), "compared/s")
	b.ReportMetric(float64(got["flood 503 login_busy"])/took.Seconds(), "busy/s")
	b.ReportMetric(float64(sent-got["flood 401 invalid_credentials"]-got["flood 503 login_busy"]), "flood-other")
	b.ReportMetric(float64(got["ana-pix 201 "]), "pix-201/20")
	b.ReportMetric(float64(paid[len(paid)*9/10].Milliseconds()), "pix-p90-ms")
	b.ReportMetric(float64(got["diego 200 "]), "device-200/5")
	b.ReportMetric(float64(got["carla 200 "]), "new-device-200/5")
	b.Logf("%v", got)
}

// loginFlood sends 100 logins a second until stop is closed, each from 10.x.y.z with a CPF of
// its own, on a bare HTTP client (the contract's checks of apitest.Client would slow the botnet
// more than the replica does); the function it returns waits for those under way and says how
// many were sent, over how long (until the stop).
func loginFlood(base string, count func(string), stop <-chan struct{}) func() (int, time.Duration) {
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	var wg sync.WaitGroup
	start, sent, done := time.Now(), 0, make(chan struct{})
	var took time.Duration // from the first login to the stop
	go func() {
		defer close(done)
		defer func() { took = time.Since(start) }()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for ; sent < int(time.Since(start)/(10*time.Millisecond)); sent++ { // a late tick sends what is due
				i := sent + 1
				wg.Go(func() {
					body := fmt.Sprintf(`{"document":%q,"password":"guess"}`, apitest.CPF(100_000+i))
					req, _ := http.NewRequest(http.MethodPost, base+"/v1/login", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
					resp, err := client.Do(req)
					if err != nil {
						count("flood error")
						return
					}
					defer resp.Body.Close()
					var r struct{ Error string }
					_ = json.NewDecoder(resp.Body).Decode(&r)
					count(fmt.Sprint("flood ", resp.StatusCode, " ", r.Error))
				})
			}
		}
	}()
	return func() (int, time.Duration) {
		<-done
		wg.Wait()
		return sent, took
	}
}
