package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// prepareLoop keeps one spare segment ready for the flusher's next cut: it
// writes Options.SegmentBytes of zeros to spareName, fsyncs the file and puts
// it in l.prepared, then waits until cut has renamed (or removed) it before
// making the next one under the same name. After a failure it logs and waits
// for the next cut (prepRetry) to try again. It never takes l.mu. Close stops
// it and waits for it; a spare no cut took is removed.
func (l *Log) prepareLoop() {
	defer close(l.prepDone)
	for {
		if l.opts.PrepareAfter >= 0 {
			select { // until the active segment is full enough to need a successor
			case <-l.prepWant:
			case <-l.quit:
				return
			}
		}
		if l.opts.testHookPrepare != nil {
			l.opts.testHookPrepare()
		}
		f, err := l.prepareSpare()
		wait := l.prepFree
		switch {
		case errors.Is(err, errStopped):
			return
		case err != nil:
			l.logger.Warn("wal: preparing a spare segment failed; cuts make plain files until the next try", "err", err)
			wait = l.prepRetry
		default:
			select {
			case l.prepared <- f:
			default:
				panic("BUG: wal: a spare segment is already prepared")
			}
			if l.opts.testHookPrepared != nil {
				l.opts.testHookPrepared()
			}
		}
		select {
		case <-wait:
			select { // a signal from the segment the spare replaced
			case <-l.prepWant:
			default:
			}
		case <-l.quit:
			select {
			case f := <-l.prepared: // no cut took it
				f.Close()
				os.Remove(f.Name())
			default:
			}
			return
		}
	}
}

// errStopped tells prepareLoop that Close interrupted a preparation.
var errStopped = errors.New("wal: stopped")

// prepareSpare creates spareName, fills it with Options.SegmentBytes of zeros
// and fsyncs it, so that records written into it later change neither the
// file's size nor its extents and their fsyncs have less metadata to
// journal. On error, or errStopped when Close interrupts it, it removes the
// file.
func (l *Log) prepareSpare() (*os.File, error) {
	path := filepath.Join(l.opts.Dir, spareName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	if err := l.zeroFill(f); err != nil {
		f.Close()
		os.Remove(path)
		if errors.Is(err, errStopped) {
			return nil, err
		}
		return nil, fmt.Errorf("wal: prepare %s: %w", path, err)
	}
	return f, nil
}

// zeroFill writes Options.SegmentBytes of zeros to f, 1 MiB per write(2), and
// fsyncs it. It returns errStopped as soon as Close was called.
func (l *Log) zeroFill(f *os.File) error {
	for off := int64(0); off < l.opts.SegmentBytes; {
		select {
		case <-l.quit:
			return errStopped
		default:
		}
		n := min(l.opts.SegmentBytes-off, int64(len(zeroBlock)))
		if _, err := f.Write(zeroBlock[:n]); err != nil {
			return err
		}
		// Sync each block: on ext4 (data=ordered) the journal commit of an
		// Append's fsync writes out every dirty page of the filesystem, and a
		// spare's 64 MiB of unsynced zeros stalled appends for seconds.
		if err := f.Sync(); err != nil {
			return err
		}
		off += n
	}
	return nil
}
