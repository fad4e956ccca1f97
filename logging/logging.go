// Package logging builds keyway's zap loggers from a [Config]: a sampled
// application logger and, optionally, an unsampled buffered access logger
// on its own core.
package logging

import (
	"io"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Loggers are the loggers built from a Config.
type Loggers struct {
	// App is the application logger: sampled (100 identical messages per
	// second, then 1 in 100), stack traces from error level.
	App *zap.Logger
	// Access is nil unless access_log is on: one entry per request, never
	// sampled, buffered (flushed every second and by Close).
	Access *zap.Logger

	buffered *zapcore.BufferedWriteSyncer
	level    zap.AtomicLevel
}

// New builds the loggers. App logs go to stderr, the access log to stdout.
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
		l.buffered = &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(stdout), Size: 256 << 10, FlushInterval: time.Second}
		l.Access = zap.New(zapcore.NewCore(newEnc(), l.buffered, zapcore.InfoLevel))
	}
	return l, nil
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

// Close flushes buffered entries. Call it once, at exit.
func (l *Loggers) Close() {
	_ = l.App.Sync()
	if l.buffered != nil {
		_ = l.buffered.Stop()
	}
}
