package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/dashboard/browsertest"
)

// TestDashboardBrowser opens the dashboard of a sandboxd on chsim in
// headless Chromium (issue 25): the page loads and takes the root token, a
// claim made over the API shows up within a second (carried by the event
// stream, not a poll), its release takes it away within a second, the
// pools, events, VMs and plots are drawn, and the page reports no console
// error. A screenshot is kept (browsertest.Screenshot: the test's temp dir,
// and $SBX_ARTIFACTS when set).
func TestDashboardBrowser(t *testing.T) {
	b := browsertest.Start(t)
	const root = "e2e-dashboard-root"
	n := startChsimNode(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "e2e", Warm: 2}}}); err != nil {
		t.Fatalf("PUT pools: %v", err)
	}
	waitInfo(t, ctx, n.c, "a warm pool", func(in *api.Info) bool { return len(in.Pools) == 1 && in.Pools[0].Warm == 2 })

	const pool = `#pools tr[data-pool="e2e/none/small"]`
	within(t, b, 30*time.Second, "the dashboard to open", chromedp.Steps(
		chromedp.Navigate("http://"+n.addr+"/"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", root),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible(pool),
		chromedp.WaitVisible("#live.on"),
		chromedp.WaitVisible(`#vms tr[data-vm]`),
	))
	cells, err := chromedp.Run(b.Ctx, chromedp.Text(pool))
	if err != nil || !strings.Contains(cells, "ready") {
		t.Errorf("pool row %q (%v): want the golden's state ready", cells, err)
	}

	// A claim over the API: its row within a second.
	cr, err := n.c.Claim(ctx, api.ClaimRequest{Template: "e2e"})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	row := `#sandboxes tr[data-id="` + cr.ID + `"]`
	appeared := within(t, b, time.Second, "the claim's row", chromedp.WaitVisible(row))
	text, err := chromedp.Run(b.Ctx, chromedp.Text(row))
	if err != nil || !strings.Contains(text, "running") || !strings.Contains(text, "warm") || !strings.Contains(text, "e2e/none/small") {
		t.Errorf("sandbox row %q (%v): want its pool, state running and tier warm", text, err)
	}
	within(t, b, time.Second, "the claim's event", chromedp.WaitVisible(`#events li[data-seq]`))
	within(t, b, 5*time.Second, "a latency point", chromedp.WaitVisible(`#latency-plot circle`))
	within(t, b, 5*time.Second, "the warm plot", chromedp.WaitVisible(`#warm-plot path`))
	shot := b.Screenshot(t, "dashboard.png")

	// Its release: the row goes within a second.
	if err := n.c.Release(ctx, cr.ID); err != nil {
		t.Fatalf("release: %v", err)
	}
	gone := within(t, b, time.Second, "the released claim's row to go", chromedp.WaitNotPresent(row))
	t.Logf("claim row after %v, gone %v after the release; screenshot %s", appeared, gone, shot)

	if errs := b.Errors(); len(errs) > 0 {
		t.Errorf("the page reported errors:\n  %s", strings.Join(errs, "\n  "))
	}
}

// within runs a on the page with a bound of d and returns how long it took.
func within(t *testing.T, b *browsertest.Browser, d time.Duration, what string, a chromedp.Action[chromedp.Void]) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, d)
	defer cancel()
	start := time.Now()
	if err := chromedp.Do(ctx, a); err != nil {
		b.Screenshot(t, "failed.png")
		t.Fatalf("waiting for %s (at most %v): %v (page errors: %v)", what, d, err, b.Errors())
	}
	return time.Since(start)
}
