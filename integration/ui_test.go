package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/demo"
	"keyway/internal/slow"
	"keyway/internal/stacktest"

	"github.com/chromedp/chromedp"
)

// chromiumPath is where Debian's chromium package puts the browser; .ci/run
// installs it.
const chromiumPath = "/usr/bin/chromium"

// TestDashboardInBrowser drives the real /ui page of a running demo in
// headless Chromium: the set's phase and its three replicas appear, a key
// lookup names a replica, the latency and time-in-state columns fill in, a
// replica out of rotation shows its share hatched and served by stand-ins,
// and a full-page screenshot is saved.
func TestDashboardInBrowser(t *testing.T) {
	slow.Skip(t)
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("browser test skipped: %s not found (install Debian's chromium: apt-get install -y chromium; .ci/run does this in CI)", chromiumPath)
	}
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	cfg, err := config.LoadBytes(demo.ConfigName, demo.ConfigYAML, config.WithSet("listen", "127.0.0.1:0"),
		config.WithSet("admin.listen", "127.0.0.1:0"), config.WithSet("gossip.bind_port", "0"), config.WithSet("log.level", "warn"))
	if err != nil {
		t.Fatal(err)
	}
	d := stacktest.StartDemo(t, cfg, Binary, "orders", 3)
	proxy, adminAddr := d.Proxy, d.Admin

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.NoSandbox,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	// The first call starts the browser: no timeout on its context.
	start := time.Now()
	if err := chromedp.Do(bctx, chromedp.Navigate("http://"+adminAddr+"/ui")); err != nil {
		t.Fatalf("navigate to /ui: %v", err)
	}
	ctx, cancel := context.WithTimeout(bctx, 15*time.Second)
	defer cancel()

	// The page polls the API; wait (bounded by ctx) for the set to be
	// Running with all three replica rows rendered.
	const ready = `(() => {
		const p = document.querySelector('.set-card[data-set="orders"] .phase');
		return !!p && p.textContent.trim() === 'Running' &&
			document.querySelectorAll('.set-card[data-set="orders"] .replica-row').length === 3;
	})()`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](ready, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(bctx, chromedp.Text("body"))
		t.Fatalf("phase Running and 3 replica rows did not appear: %v\npage text:\n%s", err, body)
	}
	phase, err := chromedp.Run(ctx, chromedp.Text(`.set-card[data-set="orders"] .phase`))
	if err != nil || strings.TrimSpace(phase) != "Running" {
		t.Fatalf("phase %q, %v", phase, err)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('.replica-row')].map(r => r.dataset.replica)`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rows, ",") != "orders-0,orders-1,orders-2" {
		t.Fatalf("replica rows %v, want orders-0..2", rows)
	}
	// The fleet panel: this proxy alone, agreeing with nobody else.
	const fleetShown = `(() => { const r = document.querySelector('#fleet .fleet-row[data-set="orders"]');
		return !document.getElementById('fleet-section').hidden && !!r && r.dataset.agree === 'true'; })()`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](fleetShown, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(bctx, chromedp.Text("#fleet-section"))
		t.Fatalf("the fleet panel did not show the set agreeing: %v\n%s", err, body)
	}
	if banner, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById('error').hidden`)); err != nil || !banner {
		t.Errorf("error banner visible (hidden=%v, %v)", banner, err)
	}

	// Traffic: send requests through the proxy; the rows' totals add up to
	// them and, two refreshes later, the set and its replicas show a
	// measured request rate (data-rate "" means not measured yet).
	const sent = 30
	for i := range sent {
		req, _ := http.NewRequest("POST", "http://"+proxy+"/ingest", strings.NewReader("x"))
		req.Header.Set("X-Key", fmt.Sprintf("ui-order-%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d through the proxy: %d", i, resp.StatusCode)
		}
	}
	traffic := fmt.Sprintf(`(() => {
		const card = document.querySelector('.set-card[data-set="orders"]');
		if (!card) return false;
		const rates = [...card.querySelectorAll('.replica-row td.rate')];
		const total = rates.reduce((n, td) => n + Number(td.dataset.total || 0), 0);
		const setRate = card.querySelector('.set-rate');
		return rates.length === 3 && total === %d && !!setRate && Number(setRate.dataset.rate) > 0 &&
			rates.some((td) => Number(td.dataset.rate) > 0) &&
			[...card.querySelectorAll('.replica-row td.errors')].every((td) => td.dataset.rate !== "" && td.dataset.total !== undefined);
	})()`, sent)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](traffic, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(bctx, chromedp.Text(`.set-card[data-set="orders"]`))
		t.Fatalf("request rates and totals of %d requests did not appear: %v\ncard text:\n%s", sent, err, body)
	}
	cells, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('.replica-row')].map((r) =>
		r.dataset.replica + ": " + r.querySelector('td.rate').innerText.replace(/\s+/g, " ") + " | " + r.querySelector('td.errors').innerText.replace(/\s+/g, " "))`))
	if err != nil {
		t.Fatal(err)
	}
	setRate, err := chromedp.Run(ctx, chromedp.Text(`.set-card[data-set="orders"] .set-rate`))
	if err != nil || !strings.Contains(setRate, "req/s") {
		t.Errorf("set rate %q, %v", setRate, err)
	}
	t.Logf("set rate: %s; rows: %s", setRate, strings.Join(cells, "; "))

	// Latency: the replicas that answered show a measured mean and p99;
	// every row says how long the replica has been in its state and in
	// rotation.
	const latency = `(() => {
		const rows = [...document.querySelectorAll('.set-card[data-set="orders"] .replica-row')];
		const answered = rows.filter((r) => Number(r.querySelector('td.rate').dataset.total) > 0);
		return rows.length === 3 && answered.length > 0 &&
			answered.every((r) => Number(r.querySelector('td.latency').dataset.mean) > 0 && Number(r.querySelector('td.latency').dataset.p99) > 0 &&
				/\d/.test(r.querySelector('td.latency').innerText)) &&
			rows.every((r) => r.querySelector('.state-since') && r.querySelector('.state-since').dataset.seconds !== "" &&
				/^for \d/.test(r.querySelector('.state-since').innerText) && /^in for \d/.test(r.querySelector('.rotation-since').innerText));
	})()`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](latency, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(bctx, chromedp.Text(`.set-card[data-set="orders"]`))
		t.Fatalf("latency and time-in-state columns did not appear: %v\ncard text:\n%s", err, body)
	}
	lat, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('.replica-row')].map((r) =>
		r.dataset.replica + ": " + r.querySelector('td.latency').innerText.replace(/\s+/g, " ") + " | " + r.querySelector('.state-since').innerText)`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("latency and time in state: %s", strings.Join(lat, "; "))

	// A replica out of rotation (its readiness switch off: its agent
	// advertises recovering): its share is hatched, labelled as served by
	// stand-ins, and its rotation line counts the time out; the others'
	// shares stay plain.
	var reps admin.ReplicaList
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/replica_sets/orders/replicas", &reps)
	readySwitch := func(v string) {
		t.Helper()
		resp, err := http.Post("http://"+reps.Replicas[2].Addr+"/_ready?v="+v, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	readySwitch("false")
	const outShown = `(() => {
		const r = document.querySelector('.replica-row[data-replica="orders-2"]');
		if (!r || r.dataset.inRotation !== 'false') return false;
		const share = r.querySelector('td.share');
		const others = [...document.querySelectorAll('.replica-row:not([data-replica="orders-2"]) td.share')];
		return share.dataset.out === 'true' && !!share.querySelector('.bar.out') &&
			share.innerText.includes('(stand-ins serve it)') && /^out for \d/.test(r.querySelector('.rotation-since').innerText) &&
			r.querySelector('.state-since').innerText.startsWith('for ') &&
			getComputedStyle(share.querySelector('.bar')).backgroundImage.includes('repeating-linear-gradient') &&
			others.length === 2 && others.every((td) => td.dataset.out === 'false' && !td.querySelector('.bar.out') && !td.innerText.includes('stand-ins'));
	})()`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](outShown, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(bctx, chromedp.Text(`.set-card[data-set="orders"]`))
		t.Fatalf("orders-2 out of rotation is not shown with a hatched share served by stand-ins: %v\ncard text:\n%s", err, body)
	}
	outRow, _ := chromedp.Run(ctx, chromedp.Text(`.replica-row[data-replica="orders-2"]`))
	t.Logf("orders-2 out of rotation: %s", strings.Join(strings.Fields(outRow), " "))
	outShot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if dst := os.Getenv("KEYWAY_UI_SCREENSHOT_OUT"); dst != "" {
		if err := os.WriteFile(dst, outShot, 0o644); err != nil {
			t.Errorf("copying the screenshot to %s: %v", dst, err)
		}
	}
	readySwitch("true")
	const backIn = `(() => { const r = document.querySelector('.replica-row[data-replica="orders-2"]');
		return !!r && r.dataset.inRotation === 'true' && r.querySelector('td.share').dataset.out === 'false' && !r.querySelector('.bar.out'); })()`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](backIn, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("orders-2 back in rotation is still shown out: %v", err)
	}

	// A replica answering 500 is ejected on the threshold: its row says
	// why and when it comes back, the set counts the 5xx its clients got,
	// and the audit list says so in a sentence. The set shows its match
	// rule and keeps a history.
	key := ""
	for _, k := range Keys(200) {
		var re admin.RouteExplain
		stacktest.GetJSON(t, "http://"+adminAddr+"/v1/route?set=orders&key="+k, &re)
		if re.Pick == "orders-1" {
			key = k
			break
		}
	}
	if key == "" {
		t.Fatal("no key of 200 goes to orders-1")
	}
	modeSwitch := func(v string) {
		t.Helper()
		resp, err := http.Post("http://"+reps.Replicas[1].Addr+"/_mode?v="+v, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	modeSwitch("500")
	for range 5 {
		req, _ := http.NewRequest(http.MethodPost, "http://"+proxy+"/ingest", strings.NewReader("x"))
		req.Header.Set("X-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	const ejectShown = `(() => {
		const r = document.querySelector('.replica-row[data-replica="orders-1"]');
		const card = document.querySelector('.set-card[data-set="orders"]');
		const ev = [...document.querySelectorAll('#events .event-row[data-kind="ejected"]')];
		return !!r && r.dataset.inRotation === 'false' && !!r.querySelector('.why') &&
			r.querySelector('.why').innerText.includes('ejected after 5 failures in a row (5xx)') &&
			/^back in \d/.test(r.querySelector('.back').innerText) &&
			!!card.querySelector('.codes .pill[data-class="5xx"]') && !!card.querySelector('.codes .pill[data-class="2xx"]') &&
			card.querySelector('.match').innerText.includes('any host /') && !!card.querySelector('.history') &&
			ev.some((e) => e.innerText.includes('orders-1 ejected after failures (5xx)'));
	})()`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](ejectShown, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(bctx, chromedp.Text(`body`))
		t.Fatalf("the ejected orders-1 is not explained: %v\npage text:\n%s", err, body)
	}
	ejRow, _ := chromedp.Run(ctx, chromedp.Text(`.replica-row[data-replica="orders-1"]`))
	t.Logf("orders-1 ejected: %s", strings.Join(strings.Fields(ejRow), " "))
	modeSwitch("ok")

	// The audit list filtered to one set shows only its events.
	if err := chromedp.Do(ctx, chromedp.SetValue(`#event-set`, "orders")); err != nil {
		t.Fatalf("audit filter: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById('event-set').dispatchEvent(new Event('change'))`)); err != nil {
		t.Fatalf("audit filter: %v", err)
	}
	const filtered = `(() => { const rows = [...document.querySelectorAll('#events .event-row')];
		return rows.length > 0 && rows.every((r) => r.dataset.set === 'orders'); })()`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](filtered, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("the audit list filtered to orders shows other events: %v", err)
	}

	// Following the key that went to orders-1: only what concerns its
	// partition is listed (its owner's ejection among it), each row saying
	// where the partition's keys went (the set's events before its first
	// ring have no placement to say).
	var keyRoute admin.RouteExplain
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/route?set=orders&key="+key, &keyRoute)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const i = document.getElementById('event-key'); i.value = `+strconv.Quote(key)+`;
		return i.dispatchEvent(new Event('change')); })()`)); err != nil {
		t.Fatalf("audit key filter: %v", err)
	}
	followed := fmt.Sprintf(`(() => { const rows = [...document.querySelectorAll('#events .event-row')];
		return rows.length > 0 && rows.every((r) => r.dataset.partition === '%d' || (r.dataset.partition === '' && !r.dataset.replica)) &&
			rows.some((r) => r.dataset.kind === 'ejected' && r.dataset.replica === 'orders-1') &&
			rows.every((r) => !r.dataset.replica || r.dataset.replica === 'orders-1' || r.querySelector('.placement').innerText.includes(r.dataset.replica)) &&
			!!document.querySelector('#events .placement'); })()`, keyRoute.Partition)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](followed, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(bctx, chromedp.Text(`#events`))
		t.Fatalf("the audit list following key %s (partition %d) is wrong: %v\n%s", key, keyRoute.Partition, err, body)
	}
	evText, _ := chromedp.Run(ctx, chromedp.Text(`#events`))
	t.Logf("audit list following key %s: %s", key, strings.Join(strings.Fields(evText), " "))

	// Look a key up through the route form.
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(`#route-form input[name=key]`, "order-42"),
		chromedp.Click(`#route-form button[type=submit]`),
	); err != nil {
		t.Fatalf("route form: %v", err)
	}
	const routed = `(() => /→\s*orders-[0-2]/.test(document.getElementById('route-result').textContent))()`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](routed, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		res, _ := chromedp.Run(bctx, chromedp.Text("#route-result"))
		t.Fatalf("route result names no orders replica: %v; #route-result: %q", err, res)
	}
	res, err := chromedp.Run(ctx, chromedp.Text("#route-result"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("route result: %s", strings.Join(strings.Fields(res), " "))

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100 gives PNG; lower qualities give JPEG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(t.TempDir(), "keyway-ui.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes) after %v", shot, len(png), time.Since(start).Round(time.Millisecond))
	// To look at it after the test: KEYWAY_UI_SCREENSHOT=/some/file.png.
	if dst := os.Getenv("KEYWAY_UI_SCREENSHOT"); dst != "" {
		if err := os.WriteFile(dst, png, 0o644); err != nil {
			t.Errorf("copying the screenshot to %s: %v", dst, err)
		}
	}
}
