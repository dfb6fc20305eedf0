package storetest

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Splitmix is SplitMix64's step: the Score benchmarks' block hashes.
func Splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// BenchLatency runs query(i) for i in [0, b.N) on one OS thread and
// reports the p50 and p99 of its wall-clock latency and of its thread's
// CPU time (CLOCK_THREAD_CPUTIME_ID: on a shared, overloaded machine, what
// the query costs an idle core), in µs. An error ends the benchmark.
func BenchLatency(b *testing.B, query func(i int) error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lat := make([]time.Duration, 0, b.N)
	cpu := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		c0, t0 := threadCPU(), time.Now()
		err := query(i)
		lat = append(lat, time.Since(t0))
		cpu = append(cpu, threadCPU()-c0)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(cpu)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds())/1e3, "cpu-p50-µs")
	b.ReportMetric(float64(cpu[len(cpu)*99/100].Nanoseconds())/1e3, "cpu-p99-µs")
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}
