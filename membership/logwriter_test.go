package membership

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// The lines below are memberlist v0.7.0's own: its format strings (net.go,
// net_transport.go, label.go, security.go) filled in the way it fills them,
// with its LogAddress/LogConn for the remote address.
var (
	udpFrom = memberlist.LogAddress(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 7946})
	tcpFrom = memberlist.LogAddress(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 40123})
	v6From  = memberlist.LogAddress(&net.TCPAddr{IP: net.IPv6loopback, Port: 40124})
)

func TestRejectionMatchesMemberlistLines(t *testing.T) {
	cases := map[string]struct {
		line   string
		reason string // "" for a line that is not a rejection
		remote string
	}{
		"stream label":                      {fmt.Sprintf("[ERR] memberlist: discarding stream with unacceptable label %q: %s", "other", tcpFrom), rejectLabel, "127.0.0.9:40123"},
		"packet label":                      {fmt.Sprintf("[ERR] memberlist: discarding packet with unacceptable label %q: %s", "", udpFrom), rejectLabel, "127.0.0.9:7946"},
		"label planted to fool the matcher": {fmt.Sprintf("[ERR] memberlist: discarding packet with unacceptable label %q: %s", "from=10.6.6.6:1 x", udpFrom), rejectLabel, "127.0.0.9:7946"},
		"stream label header": {fmt.Sprintf("[ERR] memberlist: failed to receive and remove the stream label header: %s %s",
			"cannot decode label; stream has been truncated", tcpFrom), rejectLabel, "127.0.0.9:40123"},
		"double stream label":    {fmt.Sprintf("[ERR] memberlist: unexpected double stream label header: %s", tcpFrom), rejectLabel, "127.0.0.9:40123"},
		"double packet label":    {fmt.Sprintf("[ERR] memberlist: unexpected double packet label header: %s", udpFrom), rejectLabel, "127.0.0.9:7946"},
		"truncated packet label": {fmt.Sprintf("[ERR] memberlist: %v %s", "cannot decode label; packet has been truncated", udpFrom), rejectLabel, "127.0.0.9:7946"},
		"empty packet label":     {fmt.Sprintf("[ERR] memberlist: %v %s", "label header cannot be empty when present", udpFrom), rejectLabel, "127.0.0.9:7946"},

		"packet, wrong key": {fmt.Sprintf("[ERR] memberlist: Decrypt packet failed: %v %s", "no installed keys could decrypt the message", udpFrom), rejectDecrypt, "127.0.0.9:7946"},
		"packet in clear":   {fmt.Sprintf("[ERR] memberlist: Decrypt packet failed: %v %s", "unsupported encryption version 4", udpFrom), rejectDecrypt, "127.0.0.9:7946"},
		"packet too small":  {fmt.Sprintf("[ERR] memberlist: Decrypt packet failed: %v %s", "payload is too small to decrypt: 3", udpFrom), rejectDecrypt, "127.0.0.9:7946"},
		"stream in clear": {fmt.Sprintf("[ERR] memberlist: failed to receive: %s %s",
			"encryption is configured but remote state is not encrypted", tcpFrom), rejectDecrypt, "127.0.0.9:40123"},
		"stream, wrong key": {fmt.Sprintf("[ERR] memberlist: failed to receive: %s %s", "no installed keys could decrypt the message", v6From), rejectDecrypt, "[::1]:40124"},
		"stream encrypted, no key here": {fmt.Sprintf("[ERR] memberlist: failed to receive: %s %s",
			"remote state is encrypted and encryption is not configured", tcpFrom), rejectDecrypt, "127.0.0.9:40123"},

		"stream too big":     {fmt.Sprintf("[ERR] memberlist: failed to receive: %s %s", "remote node state is larger than limit (99999999)", tcpFrom), rejectOther, "127.0.0.9:40123"},
		"stream timeout":     {fmt.Sprintf("[ERR] memberlist: failed to receive: %s %s", "read tcp 127.0.0.1:7946->127.0.0.9:40123: i/o timeout", tcpFrom), rejectOther, "127.0.0.9:40123"},
		"checksum":           {fmt.Sprintf("[WARN] memberlist: Got invalid checksum for UDP packet: %x, %x", 0xdead, 0xbeef), rejectOther, ""},
		"no type byte":       {fmt.Sprintf("[ERR] memberlist: missing message type byte %s", udpFrom), rejectOther, "127.0.0.9:7946"},
		"short packet":       {fmt.Sprintf("[ERR] memberlist: UDP packet too short (%d bytes) %s", 65536, udpFrom), rejectOther, "127.0.0.9:7946"},
		"bad stream type":    {fmt.Sprintf("[ERR] memberlist: Received invalid msgType (%d) %s", 42, tcpFrom), rejectOther, "127.0.0.9:40123"},
		"bad packet type":    {fmt.Sprintf("[ERR] memberlist: msg type (%d) not supported %s", 42, udpFrom), rejectOther, "127.0.0.9:7946"},
		"bad handler type":   {fmt.Sprintf("[ERR] memberlist: Message type (%d) not supported %s (packet handler)", 42, udpFrom), rejectOther, "127.0.0.9:7946"},
		"bad compound":       {fmt.Sprintf("[ERR] memberlist: Failed to decode compound request: %s %s", "missing compound length byte", udpFrom), rejectOther, "127.0.0.9:7946"},
		"unknown remote":     {fmt.Sprintf("[ERR] memberlist: missing message type byte %s", memberlist.LogAddress(nil)), rejectOther, ""},
		"no level, no head":  {"discarding stream with unacceptable label \"x\": from=127.0.0.9:1", rejectLabel, "127.0.0.9:1"},
		"timestamp and head": {"2026/11/29 08:00:00 [ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message " + udpFrom, rejectDecrypt, "127.0.0.9:7946"},

		"stream opened":       {fmt.Sprintf("[DEBUG] memberlist: Stream connection %s", tcpFrom), "", ""},
		"user message":        {fmt.Sprintf("[ERR] memberlist: Failed to receive user message: %s %s", "EOF", tcpFrom), "", ""},
		"outgoing encryption": {fmt.Sprintf("[ERR] memberlist: Encryption of message failed: %v", "boom"), "", ""},
		"local state":         {fmt.Sprintf("[ERROR] memberlist: Failed to encrypt local state: %v", "boom"), "", ""},
		"ping for another":    {fmt.Sprintf("[WARN] memberlist: Got ping for unexpected node %s %s", "x", tcpFrom), "", ""},
		"ack not sent":        {fmt.Sprintf("[ERR] memberlist: Failed to send ack: %s %s", "boom", udpFrom), "", ""},
		"merge":               {fmt.Sprintf("[ERR] memberlist: Failed push/pull merge: %s %s", "boom", tcpFrom), "", ""},
		"public bind":         {"[WARN] memberlist: Binding to public address without encryption!", "", ""},
		"join failed":         {"[DEBUG] memberlist: Failed to join 127.0.0.9:7946: EOF", "", ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			reason, remote, ok := rejection(tc.line)
			if ok != (tc.reason != "") || reason != tc.reason || remote != tc.remote {
				t.Fatalf("rejection(%q) = %q, %q, %v; want %q, %q", tc.line, reason, remote, ok, tc.reason, tc.remote)
			}
		})
	}
}

// Rejections are counted by reason and warned about once per reason and
// host per rejectLogEvery, with the count left out since; other lines are
// logged as before and counted nowhere.
func TestLogWriterCountsAndRateLimitsRejections(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := newMetrics(reg, func() int { return 0 })
	core, logs := observer.New(zapcore.DebugLevel)
	w := newLogWriter(zap.New(core), m.rejected)
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	w.now = func() time.Time { return now }
	write := func(format string, args ...any) {
		t.Helper()
		// As log.Logger writes: a time stamp, one line.
		if _, err := fmt.Fprintf(w, "2026/11/29 08:00:00 "+format+"\n", args...); err != nil {
			t.Fatal(err)
		}
	}
	decrypt := "[ERR] memberlist: failed to receive: encryption is configured but remote state is not encrypted %s"
	for port := 40000; port < 40003; port++ { // one host, three streams
		write(decrypt, memberlist.LogAddress(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: port}))
	}
	write(decrypt, tcpFrom) // the same host: left out
	write(decrypt, v6From)  // another host: warned about
	write("[ERR] memberlist: discarding packet with unacceptable label %q: %s", "other", udpFrom)
	write("[WARN] memberlist: Got ping for unexpected node %s %s", "x", tcpFrom)

	for reason, want := range map[string]float64{"decrypt": 5, "label": 1, "other": 0} {
		if got := testutil.ToFloat64(m.rejected.WithLabelValues(reason)); got != want {
			t.Errorf("keyway_gossip_rejected_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	warns := func() []observer.LoggedEntry {
		return logs.FilterMessageSnippet("gossip rejected").FilterLevelExact(zapcore.WarnLevel).AllUntimed()
	}
	got := warns()
	if len(got) != 3 {
		t.Fatalf("%d rejection warnings, want 3 (decrypt from 127.0.0.9, decrypt from ::1, label): %v", len(got), got)
	}
	for i, w := range []struct{ reason, remote string }{{"decrypt", "127.0.0.9:40000"}, {"decrypt", "[::1]:40124"}, {"label", "127.0.0.9:7946"}} {
		f := got[i].ContextMap()
		if f["reason"] != w.reason || f["remote"] != w.remote || f["suppressed"] != int64(0) {
			t.Errorf("warning %d: %v, want reason %s remote %s suppressed 0", i, f, w.reason, w.remote)
		}
	}
	if n := logs.FilterMessageSnippet("gossip rejected").FilterLevelExact(zapcore.DebugLevel).Len(); n != 3 {
		t.Errorf("%d rejections logged at debug, want the 3 left out", n)
	}
	if n := logs.FilterMessage("Got ping for unexpected node x " + tcpFrom).FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Errorf("a line that is no rejection was logged %d times at warn, want once", n)
	}

	// Within the interval: still left out; after it: one warning with the
	// count left out.
	now = now.Add(rejectLogEvery - time.Millisecond)
	write(decrypt, tcpFrom)
	if n := len(warns()); n != 3 {
		t.Fatalf("%d warnings within the interval, want still 3", n)
	}
	now = now.Add(time.Millisecond)
	write(decrypt, tcpFrom)
	got = warns()
	if len(got) != 4 {
		t.Fatalf("%d warnings after the interval, want 4", len(got))
	}
	if f := got[3].ContextMap(); f["suppressed"] != int64(4) || f["remote"] != "127.0.0.9:40123" {
		t.Fatalf("warning after the interval: %v, want suppressed 4 from 127.0.0.9:40123", f)
	}
	lint(t, reg)
}

// The limiter remembers at most maxRejectLimits hosts: past it, a new
// host's rejections are counted and logged at debug only, until the
// remembered ones are stale.
func TestLogWriterBoundsRemembered(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := newMetrics(reg, func() int { return 0 })
	core, logs := observer.New(zapcore.WarnLevel)
	w := newLogWriter(zap.New(core), m.rejected)
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	w.now = func() time.Time { return now }
	line := func(i int) string {
		return fmt.Sprintf("[ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message from=10.0.%d.%d:7946\n", i/256, i%256)
	}
	for i := 0; i <= maxRejectLimits; i++ {
		fmt.Fprint(w, line(i))
	}
	if n := logs.Len(); n != maxRejectLimits {
		t.Fatalf("%d warnings for %d hosts, want %d", n, maxRejectLimits+1, maxRejectLimits)
	}
	if len(w.limits) != maxRejectLimits {
		t.Fatalf("%d hosts remembered, want %d", len(w.limits), maxRejectLimits)
	}
	now = now.Add(rejectLogEvery)
	fmt.Fprint(w, line(maxRejectLimits))
	if n := logs.Len(); n != maxRejectLimits+1 {
		t.Fatalf("a new host once the others are stale: %d warnings, want %d", n, maxRejectLimits+1)
	}
	if got := testutil.ToFloat64(m.rejected.WithLabelValues(rejectDecrypt)); got != maxRejectLimits+2 {
		t.Fatalf("counted %v, want %d", got, maxRejectLimits+2)
	}
}
