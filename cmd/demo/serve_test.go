package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
)

// TestLivePicture drives the demo's page (-serve) in headless Chromium: the burst story, stepped
// to its verdict, shows 10 × 201 and 5 × 429 PIX answers, and the PIX sent alone before them
// with its two Redis calls; every expectation of the run is ✔; the
// login attack draws some of its refusals as answered from the replicas' memory; stepped to the
// 2× hole's verdict, the fixed window drew 10 admissions and the sliding log 5.
// With PIXLIMIT_SCREENSHOTS=dir it also writes the sequence and the window as PNGs there (a
// relative dir from the repository's root: docs/, the README's). It skips where Chromium is
// absent; .ci/run installs it.
func TestLivePicture(t *testing.T) {
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium): the page is not tested in a browser here")
	}
	addr := apitest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out apitest.Logs // the demo writes it from its goroutine while the test reads it
	finished := make(chan error, 1)
	go func() {
		finished <- runFast(ctx, []string{"demo", "-scenario", "burst,login,hole", "-serve", addr}, &out, &out)
	}()
	defer func() {
		cancel()
		select {
		case err := <-finished:
			if err != nil && ctx.Err() == nil {
				t.Errorf("demo: %v\n%s", err, out.String())
			}
		case <-time.After(10 * time.Second):
			t.Error("the demo did not stop within 10 s of its context")
		}
	}()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("no-first-run", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1600, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	start := time.AfterFunc(60*time.Second, cancelBrowser) // starting the browser has no timeout of its own
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	start.Stop()
	tctx, cancelTimeout := context.WithTimeout(bctx, 90*time.Second)
	defer cancelTimeout()

	var page string
	for deadline := time.Now().Add(10 * time.Second); ; {
		if page = pageURL(out.String()); page != "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if page == "" {
		t.Fatalf("the demo printed no page address:\n%s", out.String())
	}
	js := func(expr string) int {
		t.Helper()
		v, err := chromedp.Run(tctx, chromedp.Evaluate[int](expr))
		if err != nil {
			t.Fatalf("%s: %v\n%s", expr, err, out.String())
		}
		return v
	}
	count := func(sel string) int { return js("document.querySelectorAll(`" + sel + "`).length") }
	if err := chromedp.Do(tctx, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS(`#status.done`))); err != nil {
		t.Fatalf("the page never said the stories were done: %v\n%s", err, out.String())
	}
	js(`pixlimit.seekAfter("15 PIX:")`)
	ok201, refused429 := count(`#seq .reply.s201[data-path="/v1/pix"]`), count(`#seq .reply.s429[data-path="/v1/pix"]`)
	// The PIX sent alone before the burst is drawn with its two script calls; the burst's, whose
	// calls mix, with one unnumbered arrow each.
	pixCalls := count(`#seq .exchange[data-path="/v1/pix"] .decide[data-scripts="2"] line.script`)
	var seqPNG, windowPNG []byte
	if os.Getenv("PIXLIMIT_SCREENSHOTS") != "" {
		var err error
		if seqPNG, err = chromedp.Run(tctx, chromedp.Screenshot(chromedp.CSS(`#sequence`))); err != nil {
			t.Fatal(err)
		}
		if windowPNG, err = chromedp.Run(tctx, chromedp.Screenshot(chromedp.CSS(`#windows-box`))); err != nil {
			t.Fatal(err)
		}
	}
	js(`pixlimit.seekAfter("most refusals cost no Redis call")`)
	fromMemory, loginRefusals := count(`#seq .decide.memory`), count(`#seq .reply.s429[data-path="/v1/login"]`)
	js(`pixlimit.seekAfter("fixed window:")`)
	fixed := js(`+document.querySelector('.hole-row[data-algorithm="fixed_window"][data-group="boundary"] .admitted').dataset.admitted`)
	log := js(`+document.querySelector('.hole-row[data-algorithm="sliding_log"][data-group="boundary"] .admitted').dataset.admitted`)
	js(`(pixlimit.seek(pixlimit.events.length), 0)`)
	failed, held := count(`#story-list .verdict.no`), count(`#story-list .verdict.ok`)
	verdicts := js(`pixlimit.events.filter(e => e.kind === "verdict").length`)
	if ok201 != 10 || refused429 != 5 {
		t.Errorf("at the burst's verdict the diagram shows %d × 201 and %d × 429 PIX answers, want 10 and 5", ok201, refused429)
	}
	if failed != 0 || held != verdicts || verdicts < 10 {
		which, _ := chromedp.Run(tctx, chromedp.Evaluate[string](
			`[...document.querySelectorAll('#story-list .verdict.no')].map(e => e.textContent).join(" | ")`))
		t.Errorf("expectations on the page: %d ✔ and %d ✘ of %d, want every one ✔: %s\n%s", held, failed, verdicts, which, out.String())
	}
	if fromMemory == 0 || fromMemory > loginRefusals {
		t.Errorf("the login attack drew %d decisions from the replicas' memory among %d refusals, want some and no more", fromMemory, loginRefusals)
	}
	if pixCalls != 2 {
		t.Errorf("the PIX sent alone before the burst drew %d script calls, want its 2", pixCalls)
	}
	if fixed != 10 || log != 5 {
		t.Errorf("the 2× hole drew %d admissions for the fixed window and %d for the sliding log, want 10 and 5", fixed, log)
	}
	if dir := os.Getenv("PIXLIMIT_SCREENSHOTS"); dir != "" {
		if !filepath.IsAbs(dir) { // as given from the repository's root, where the README runs it
			dir = filepath.Join("..", "..", dir)
		}
		for name, png := range map[string][]byte{"demo-sequence.png": seqPNG, "demo-window.png": windowPNG} {
			if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
				t.Error(err)
			}
		}
	}
}

// pageURL is the page's address as the demo printed it, or "".
func pageURL(out string) string {
	const lead = "The live picture of the stories: "
	i := strings.Index(out, lead)
	if i < 0 {
		return ""
	}
	rest := out[i+len(lead):]
	if j := strings.IndexAny(rest, " \n"); j >= 0 {
		return rest[:j]
	}
	return ""
}
