package indexmetrics

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
)

// TestMetricNamesAndEvents: the metrics keep the names the docs, alerts
// and dashboards use, and each Observer event and decorated Store call
// moves its metric.
func TestMetricNamesAndEvents(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	var _ kvindex.Observer = m

	m.Delta(kvindex.Applied, 3)
	m.Delta(kvindex.Duplicate, 5)
	m.Resync("gap")
	m.SnapshotApplied()
	m.Refused("ingest")
	m.StreamOpened()
	m.StreamOpened()
	m.StreamClosed()
	m.Scored(time.Millisecond)
	_, err := m.Store(memstore.New()).ExpireLeases(context.Background(), time.Now())
	require.NoError(t, err)

	assert.Equal(t, 1.0, testutil.ToFloat64(m.deltas.WithLabelValues(kvindex.Applied.String())))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.deltas.WithLabelValues(kvindex.Duplicate.String())))
	assert.Equal(t, 3.0, testutil.ToFloat64(m.blockEvents), "block events count only for an applied delta")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.resyncs.WithLabelValues("gap")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.snapshots))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.refused.WithLabelValues("ingest")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.streams))

	families, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	assert.ElementsMatch(t, []string{
		"inferencecache_index_deltas_total", "inferencecache_index_block_events_total",
		"inferencecache_index_resyncs_total", "inferencecache_index_snapshots_applied_total",
		"inferencecache_index_refused_total", "inferencecache_index_streams",
		"inferencecache_index_apply_duration_seconds", "inferencecache_index_score_duration_seconds",
	}, names, "evictions appear once a lease expires a pod")
}
