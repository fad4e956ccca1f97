package membership

import (
	"bytes"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// logWriter turns memberlist's log lines ("2026/11/29 08:00:00 [WARN]
// memberlist: ...") into zap entries at the matching level. memberlist
// writes one line per call, possibly from several goroutines at once.
//
// memberlist discards inbound packets and streams it cannot decrypt or
// whose label differs, and only logs it. Those lines (see rejection) are
// counted in keyway_gossip_rejected_total{reason} and logged as one
// warning per reason and remote host per rejectLogEvery, saying how many
// were left out since; the others of that reason and host go to debug.
type logWriter struct {
	log *zap.Logger
	// rejected counts rejections by reason; nil counts nothing.
	rejected *prometheus.CounterVec
	// now is the rate limiter's clock.
	now func() time.Time

	mu     sync.Mutex
	limits map[rejectKey]*rejectLimit
}

// rejectLogEvery is the least time between two warnings about rejections
// of one reason from one remote host.
const rejectLogEvery = 10 * time.Second

// maxRejectLimits bounds the (reason, host) pairs the rate limiter
// remembers: past it, stale pairs are dropped, and rejections from new
// hosts are only counted (and logged at debug) until room is made.
const maxRejectLimits = 256

type rejectKey struct{ reason, host string }

type rejectLimit struct {
	last       time.Time // the last warning
	suppressed int       // rejections not warned about since
}

func newLogWriter(log *zap.Logger, rejected *prometheus.CounterVec) *logWriter {
	return &logWriter{log: log, rejected: rejected, now: time.Now, limits: map[rejectKey]*rejectLimit{}}
}

func (w *logWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	msg := line
	level := zap.InfoLevel
	errLine := false
	if i := bytes.IndexByte(line, '['); i >= 0 {
		if j := bytes.IndexByte(line[i:], ']'); j > 0 {
			switch string(line[i+1 : i+j]) {
			case "DEBUG", "TRACE":
				level = zap.DebugLevel
			case "WARN":
				level = zap.WarnLevel
			case "ERR", "ERROR":
				// Warn, not Error: these are operational (a foreign label,
				// a failed probe) and a stack trace of this writer helps no one.
				level, errLine = zap.WarnLevel, true
			}
			msg = bytes.TrimSpace(line[i+j+1:])
		}
	}
	msg = bytes.TrimPrefix(msg, []byte("memberlist: "))
	if reason, remote, ok := rejection(string(msg)); ok {
		w.reject(reason, remote, string(msg))
		return len(p), nil
	}
	if ce := w.log.Check(level, string(msg)); ce != nil {
		if errLine {
			ce.Write(zap.Bool("memberlist_error", true))
		} else {
			ce.Write()
		}
	}
	return len(p), nil
}

// reject counts one rejection and logs it, rate-limited.
func (w *logWriter) reject(reason, remote, detail string) {
	if w.rejected != nil {
		w.rejected.WithLabelValues(reason).Inc()
	}
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h // a stream's port is ephemeral: one host, one limit
	}
	now := w.now()
	w.mu.Lock()
	k := rejectKey{reason, host}
	l := w.limits[k]
	if l == nil {
		if len(w.limits) >= maxRejectLimits {
			for k, l := range w.limits {
				if now.Sub(l.last) >= rejectLogEvery {
					delete(w.limits, k)
				}
			}
		}
		if len(w.limits) < maxRejectLimits {
			l = &rejectLimit{}
			w.limits[k] = l
		}
	}
	warn, suppressed := false, 0
	switch {
	case l == nil:
	case l.last.IsZero() || now.Sub(l.last) >= rejectLogEvery:
		warn, suppressed = true, l.suppressed
		l.last, l.suppressed = now, 0
	default:
		l.suppressed++
	}
	w.mu.Unlock()
	if !warn {
		if ce := w.log.Check(zap.DebugLevel, "gossip rejected a packet or stream"); ce != nil {
			ce.Write(zap.String("reason", reason), zap.String("remote", remote), zap.String("detail", detail))
		}
		return
	}
	w.log.Warn("gossip rejected a packet or stream (counted in keyway_gossip_rejected_total)",
		zap.String("reason", reason), zap.String("remote", remote), zap.String("detail", detail),
		zap.Int("suppressed", suppressed), zap.Duration("suppressed_within", rejectLogEvery))
}

// Rejection reasons, the values of keyway_gossip_rejected_total's label.
const (
	rejectDecrypt = "decrypt" // not encrypted with a key of this node's, or encrypted while this node has none
	rejectLabel   = "label"   // another cluster label, or a malformed label header
	rejectOther   = "other"   // malformed: bad checksum, unknown message type, undecodable stream
)

var rejectReasons = []string{rejectDecrypt, rejectLabel, rejectOther}

// rejectionLines are the log lines with which memberlist v0.7.0 reports
// an inbound packet or stream it discarded (net.go: handleConn, readStream,
// ingestPacket, handleCommand; net_transport.go: udpListen), in lower
// case, without the "[ERR] memberlist: " head. A line matches when it
// starts with prefix and contains contains; the first match wins.
var rejectionLines = []struct{ prefix, contains, reason string }{
	// handleConn, a stream with another label or a bad label header.
	{"discarding stream with unacceptable label", "", rejectLabel},
	{"failed to receive and remove the stream label header", "", rejectLabel},
	{"unexpected double stream label header", "", rejectLabel},
	// ingestPacket, a packet with another label or a bad label header
	// (RemoveLabelHeaderFromPacket's errors are logged bare).
	{"discarding packet with unacceptable label", "", rejectLabel},
	{"unexpected double packet label header", "", rejectLabel},
	{"cannot decode label", "", rejectLabel},
	{"label header cannot be empty", "", rejectLabel},
	// ingestPacket, a packet no key decrypts (or in clear while
	// encryption is on).
	{"decrypt packet failed", "", rejectDecrypt},
	// handleConn after readStream: "encryption is configured but remote
	// state is not encrypted", "remote state is encrypted and encryption
	// is not configured", "no installed keys could decrypt the message",
	// "unsupported encryption version", "payload is too small to
	// decrypt", "cannot decrypt empty payload".
	{"failed to receive: ", "crypt", rejectDecrypt},
	// Any other stream readStream refused (never io.EOF: not logged).
	{"failed to receive: ", "", rejectOther},
	{"got invalid checksum for udp packet", "", rejectOther},
	{"missing message type byte", "", rejectOther},
	{"udp packet too short", "", rejectOther},
	{"received invalid msgtype", "", rejectOther},
	{"msg type (", "not supported", rejectOther},
	{"message type (", "not supported", rejectOther},
	{"failed to decode compound request", "", rejectOther},
}

// rejection reports whether a memberlist log message (its text after
// "[ERR] memberlist: "; a head left on is skipped) says that an inbound
// packet or stream was discarded, why, and the remote address it names
// ("from=ADDR"; "" when it names none).
func rejection(msg string) (reason, remote string, ok bool) {
	s := strings.ToLower(strings.TrimSpace(msg))
	if i := strings.Index(s, "memberlist: "); i >= 0 {
		s = s[i+len("memberlist: "):]
	} else if i := strings.Index(s, "] "); i >= 0 && strings.HasPrefix(s, "[") {
		s = s[i+len("] "):]
	}
	for _, r := range rejectionLines {
		if strings.HasPrefix(s, r.prefix) && strings.Contains(s[len(r.prefix):], r.contains) {
			reason, ok = r.reason, true
			break
		}
	}
	if !ok {
		return "", "", false
	}
	if i := strings.LastIndex(msg, "from="); i >= 0 {
		remote = msg[i+len("from="):]
		if j := strings.IndexAny(remote, " \t"); j >= 0 {
			remote = remote[:j]
		}
		if remote == "<unknown" {
			remote = ""
		}
	}
	return reason, remote, true
}
