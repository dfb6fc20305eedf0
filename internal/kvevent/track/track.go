// Package track classifies an engine rank's batch sequence numbers: in
// order, a duplicate already recovered by replay, a gap to replay, or a
// publisher restart (a new epoch). It is pure: the subscriber acts on its
// verdicts.
//
// vLLM numbers batches from 0 per publisher process and PUB delivers them
// in order, so on the live stream a sequence at or below the highest one
// seen means the engine restarted. Sequences below the next expected one
// but above that highest live one were already applied from a replay.
package track

// Verdict is what to do with a batch.
type Verdict int

// Verdicts.
const (
	// Apply: the batch is the next one.
	Apply Verdict = iota
	// Duplicate: already applied (from a replay); drop it.
	Duplicate
	// Gap: batches [From, To] are missing; replay them, then apply this one.
	Gap
	// Restart: the publisher restarted; start a new epoch with this batch.
	Restart
)

func (v Verdict) String() string {
	return [...]string{"apply", "duplicate", "gap", "restart"}[v]
}

// Rank tracks one publisher rank. The zero value expects sequence 0.
type Rank struct {
	next     uint64 // the next sequence to apply
	liveHigh uint64 // the highest sequence seen on the live stream
	seenLive bool
}

// Next is the next sequence to apply.
func (r *Rank) Next() uint64 { return r.next }

// Live classifies a batch received on the live stream. For a Gap it also
// returns the missing range. A first batch with a sequence above 0 is a
// gap from 0: the subscriber joined late.
func (r *Rank) Live(seq uint64) (v Verdict, from, to uint64) {
	if r.seenLive && seq <= r.liveHigh {
		return Restart, 0, 0
	}
	r.seenLive, r.liveHigh = true, seq
	return r.Replayed(seq)
}

// Replayed classifies a batch received from a replay: Apply when it is the
// next one, Duplicate when already applied, Gap when the replay skipped
// sequences (the engine's ring no longer holds them).
func (r *Rank) Replayed(seq uint64) (v Verdict, from, to uint64) {
	switch {
	case seq < r.next:
		return Duplicate, 0, 0
	case seq == r.next:
		return Apply, 0, 0
	}
	return Gap, r.next, seq - 1
}

// Applied records that seq was applied.
func (r *Rank) Applied(seq uint64) { r.next = seq + 1 }

// Skip gives up on the sequences before seq (lost for good).
func (r *Rank) Skip(seq uint64) {
	if seq > r.next {
		r.next = seq
	}
}

// Restarted starts over for a new publisher whose first batch is seq.
func (r *Rank) Restarted(seq uint64) {
	*r = Rank{seenLive: true, liveHigh: seq}
}
