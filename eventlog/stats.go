package eventlog

// Stats is a snapshot of the log's position and its store's health, for
// metrics and for waiting out background work (benchmarks, tests).
type Stats struct {
	FirstSeq, LastSeq uint64
	// DiskBytes is the store's total size on disk (tables and WAL).
	DiskBytes uint64
	// L0Files is the number of level-0 tables; a growing count means
	// compactions lag the write rate.
	L0Files int64
	// CompactionDebtBytes estimates what compactions still have to rewrite
	// for the store to settle.
	CompactionDebtBytes uint64
	// Background is the number of flushes and compactions running.
	Background int64
}

// Stats returns current figures; ErrClosed after Close.
func (l *Log) Stats() (Stats, error) {
	if !l.gate.enter() {
		return Stats{}, ErrClosed
	}
	defer l.gate.exit()
	m := l.db.Metrics()
	return Stats{
		FirstSeq:            l.first.Load(),
		LastSeq:             l.durable.Load(),
		DiskBytes:           m.DiskSpaceUsage(),
		L0Files:             m.Levels[0].TablesCount,
		CompactionDebtBytes: m.Compact.EstimatedDebt,
		Background:          m.Compact.NumInProgress + m.Flush.NumInProgress,
	}, nil
}
