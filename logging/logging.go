// Package logging builds keyway's logs from a [Config]: a sampled zap
// application logger and, optionally, the access log ([AccessLog]): one
// JSON line per request, buffered, to stdout or a file reopened for log
// rotation.
package logging

import (
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Loggers are the loggers built from a Config.
type Loggers struct {
	// App is the application logger: sampled (100 identical messages per
	// second, then 1 in 100), stack traces from error level.
	App *zap.Logger
	// Access is nil unless access_log is on: one line per request, never
	// sampled, buffered (flushed every second and by Close).
	Access *AccessLog

	level zap.AtomicLevel
}

// New builds the loggers. App logs go to stderr, the access log to stdout
// or to the file log.access.path, which New opens (creating it). With
// log.access.key: hmac it reads the secret ($KEYWAY_ACCESS_LOG_KEY_SECRET,
// else the secret file). It starts no goroutine: the access log's flusher
// starts with its first line.
func New(cfg Config, stderr, stdout io.Writer) (*Loggers, error) {
	level, err := zapcore.ParseLevel(cfg.Level)
	if err != nil {
		return nil, err
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	newEnc := func() zapcore.Encoder {
		if cfg.Format == "console" {
			c := encCfg
			c.EncodeLevel = zapcore.CapitalLevelEncoder
			return zapcore.NewConsoleEncoder(c)
		}
		return zapcore.NewJSONEncoder(encCfg)
	}
	atom := zap.NewAtomicLevelAt(level)
	core := zapcore.NewSamplerWithOptions(
		zapcore.NewCore(newEnc(), zapcore.Lock(zapcore.AddSync(stderr)), atom),
		time.Second, 100, 100)
	l := &Loggers{App: zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel)), level: atom}
	if cfg.AccessLog {
		l.Access, err = newAccessLog(cfg.Access, accessOptions{stdout: stdout, log: l.App.Named("access_log")})
		if err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Register registers the access log's metrics (keyway_access_log_*) with
// reg; without an access log there are none.
func (l *Loggers) Register(reg prometheus.Registerer) error {
	if l.Access == nil {
		return nil
	}
	return reg.Register(l.Access)
}

// ReopenAccessLog reopens the access log file (after a rotation; SIGUSR1).
// Without an access log file it does nothing.
func (l *Loggers) ReopenAccessLog() error {
	if l.Access == nil {
		return nil
	}
	return l.Access.Reopen()
}

// SetLevel changes the application logger's minimum level (debug, info,
// warn or error) at run time, for a configuration reload.
func (l *Loggers) SetLevel(level string) error {
	lv, err := zapcore.ParseLevel(level)
	if err != nil {
		return err
	}
	l.level.SetLevel(lv)
	return nil
}

// Level returns the application logger's minimum level.
func (l *Loggers) Level() string { return l.level.Level().String() }

// Close writes out buffered access-log lines and closes the access log
// file. Call it at exit, after the last request; it is idempotent.
func (l *Loggers) Close() {
	if l.Access != nil {
		if err := l.Access.Close(); err != nil {
			l.App.Error("closing the access log failed", zap.Error(err))
		}
	}
	_ = l.App.Sync()
}
