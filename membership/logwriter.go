package membership

import (
	"bytes"

	"go.uber.org/zap"
)

// logWriter turns memberlist's log lines ("2026/11/29 08:00:00 [WARN]
// memberlist: ...") into zap entries at the matching level. memberlist
// writes one line per call.
type logWriter struct{ log *zap.Logger }

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
	if ce := w.log.Check(level, string(msg)); ce != nil {
		if errLine {
			ce.Write(zap.Bool("memberlist_error", true))
		} else {
			ce.Write()
		}
	}
	return len(p), nil
}
