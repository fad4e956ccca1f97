package backend

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

// client-go logs through klog (k8s.io/klog/v2), which by default writes
// its own text format to stderr, outside keyway's JSON logs. RouteKlog
// sends it to a zap logger instead, through klogSink: a small logr.LogSink
// over zap, written here because github.com/go-logr/zapr is not among the
// module's requirements.

// klogRoute is process-global because klog is: the sink installed once,
// and the zap logger it writes to, swapped atomically.
var klogRoute struct {
	once sync.Once
	log  atomic.Pointer[zap.Logger]
}

// RouteKlog sends klog's output, and so client-go's, to log. A klog
// line at V(0) goes to Info, one at V(1) or above to Debug; klog's own
// verbosity (-v, default 0) still decides which lines are made at all.
// klog's errors go to Warn, with the error in the "error" field: client-go
// retries what it reports, and keyway logs the consequences that matter.
// klog's warnings arrive as plain lines: klog gives a LogSink no severity
// but error or not, so they go to Info. A nil log discards klog's output.
//
// The first call installs the route with klog.SetLogger, which klog
// allows only while no other goroutine logs through klog: make it before
// the first client-go client runs. Later calls only replace log, and are
// safe at any time and from any goroutine; the last call wins.
func RouteKlog(log *zap.Logger) {
	if log == nil {
		log = zap.NewNop()
	}
	klogRoute.log.Store(log)
	klogRoute.once.Do(func() { klog.SetLogger(logr.New(newKlogSink())) })
}

// klogSink is a logr.LogSink that writes to klogRoute's logger. Its
// methods that return a sink return a copy; a sink is not modified after
// Init, so it is safe for concurrent use.
type klogSink struct {
	name   string      // the WithName names, joined by "."
	fields []zap.Field // the WithValues pairs
	// skip is the number of stack frames zap skips to reach the call
	// site that logged: the sink's own two (write, and Info or Error),
	// plus what logr (Init) and klog (WithCallDepth) add.
	skip int
}

func newKlogSink() *klogSink { return &klogSink{skip: 2} }

var _ logr.CallDepthLogSink = (*klogSink)(nil)

func (s *klogSink) Init(info logr.RuntimeInfo) { s.skip += info.CallDepth }

func (s *klogSink) Enabled(level int) bool {
	return klogRoute.log.Load().Core().Enabled(klogLevel(level))
}

func (s *klogSink) Info(level int, msg string, kv ...any) {
	s.write(klogLevel(level), msg, nil, kv)
}

func (s *klogSink) Error(err error, msg string, kv ...any) {
	s.write(zapcore.WarnLevel, msg, err, kv)
}

func (s *klogSink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.fields = appendKlogFields(s.fields[:len(s.fields):len(s.fields)], kv)
	return &c
}

func (s *klogSink) WithName(name string) logr.LogSink {
	c := *s
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return &c
}

func (s *klogSink) WithCallDepth(depth int) logr.LogSink {
	c := *s
	c.skip += depth
	return &c
}

// klogLevel maps a logr verbosity to a zap level: 0 is Info, more is
// Debug.
func klogLevel(v int) zapcore.Level {
	if v <= 0 {
		return zapcore.InfoLevel
	}
	return zapcore.DebugLevel
}

func (s *klogSink) write(lvl zapcore.Level, msg string, err error, kv []any) {
	log := klogRoute.log.Load().WithOptions(zap.AddCallerSkip(s.skip))
	if s.name != "" {
		log = log.Named(s.name)
	}
	ce := log.Check(lvl, msg)
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, len(s.fields)+len(kv)/2+2)
	fields = appendKlogFields(append(fields, s.fields...), kv)
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	ce.Write(fields...)
}

// appendKlogFields turns logr's alternating keys and values into zap
// fields. A key without a value gets "(MISSING)", as in klog's own
// output; a value that is a logr.Marshaler is logged as MarshalLog's
// result.
func appendKlogFields(fields []zap.Field, kv []any) []zap.Field {
	for i := 0; i < len(kv); i += 2 {
		key, ok := kv[i].(string)
		if !ok {
			key = fmt.Sprint(kv[i])
		}
		if i+1 == len(kv) {
			fields = append(fields, zap.String(key, "(MISSING)"))
			break
		}
		v := kv[i+1]
		if m, ok := v.(logr.Marshaler); ok {
			v = marshalLog(m)
		}
		fields = append(fields, zap.Any(key, v))
	}
	return fields
}

// marshalLog calls MarshalLog, turning a panic into a value: a log line
// must not take the process down.
func marshalLog(m logr.Marshaler) (v any) {
	defer func() {
		if r := recover(); r != nil {
			v = fmt.Sprintf("<panic: %v>", r)
		}
	}()
	return m.MarshalLog()
}
