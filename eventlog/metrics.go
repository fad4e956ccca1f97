package eventlog

import "github.com/prometheus/client_golang/prometheus"

// Reasons of keyway_audit_dropped_total.
const (
	dropQueueFull  = "queue_full"  // the writer's queue was full
	dropWriteError = "write_error" // the file could not be written
)

type metrics struct {
	events       *prometheus.CounterVec // kind
	dropped      *prometheus.CounterVec // reason
	droppedQueue prometheus.Counter
	droppedWrite prometheus.Counter
	writeErrors  prometheus.Counter
	rotations    prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "audit", Name: "events_total",
			Help: "Audit events emitted, by kind (whether or not they reached a file).",
		}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "audit", Name: "dropped_total",
			Help: "Audit events kept in memory but not written to a file, by reason (queue_full, write_error).",
		}, []string{"reason"}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "audit", Name: "write_errors_total",
			Help: "Failed file operations of the audit trail (mkdir, list, create, write, close, sync, remove).",
		}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "audit", Name: "file_rotations_total",
			Help: "Audit files closed because the next line would have taken them past max_file_bytes.",
		}),
	}
	m.droppedQueue = m.dropped.WithLabelValues(dropQueueFull)
	m.droppedWrite = m.dropped.WithLabelValues(dropWriteError)
	return m
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.events, m.dropped, m.writeErrors, m.rotations} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// kind returns the events counter of kind. A kind that is not valid UTF-8
// cannot be a label value: its events are not counted.
func (m *metrics) kind(kind string) prometheus.Counter {
	c, err := m.events.GetMetricWithLabelValues(kind)
	if err != nil {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "unregistered"})
	}
	return c
}
