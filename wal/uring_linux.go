//go:build linux

package wal

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// uring fsyncs through an io_uring: the kernel runs the fsync on one of its
// worker threads, and the ring's eventfd, read through Go's netpoller, wakes
// the waiting goroutine. A goroutine blocked in fsync(2) itself keeps its
// scheduler slot (P) until the runtime's sysmon takes it back, tens to
// hundreds of µs later, which under SyncBatch left a core idle for much of
// every fsync; waiting on the eventfd holds none. One operation at a time:
// safe for concurrent use.
type uring struct {
	mu   sync.Mutex
	fd   int
	ring []byte // the SQ and CQ rings (IORING_FEAT_SINGLE_MMAP)
	sqes []byte
	ev   *os.File // eventfd, nonblocking: in the netpoller

	sqTail, sqMask, cqHead, cqTail, cqMask *uint32
	sqArray                                unsafe.Pointer
	cqes                                   unsafe.Pointer
	buf                                    [8]byte
	broken                                 error // set once the ring failed; guarded by mu
}

// ioUringParams is struct io_uring_params (linux/io_uring.h), 120 bytes.
type ioUringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

const (
	ioringFeatSingleMmap  = 1 << 0
	ioringOffSQES         = 0x10000000
	ioringOpFsync         = 3
	ioringRegisterEventfd = 4
	uringEntries          = 4
	sqeSize               = 64
	cqeSize               = 16
)

// newURing sets up a small ring with an eventfd, or returns why it cannot
// (no io_uring in the kernel, or a seccomp profile that refuses it).
func newURing() (*uring, error) {
	var p ioUringParams
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uringEntries, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	u := &uring{fd: int(fd)}
	fail := func(err error) (*uring, error) {
		u.close()
		return nil, err
	}
	if p.features&ioringFeatSingleMmap == 0 {
		return fail(errors.New("io_uring: no IORING_FEAT_SINGLE_MMAP (kernel before 5.4)"))
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqes+p.cqEntries*cqeSize)
	var err error
	if u.ring, err = unix.Mmap(u.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("io_uring: mmap rings: %w", err))
	}
	if u.sqes, err = unix.Mmap(u.fd, ioringOffSQES, int(p.sqEntries*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("io_uring: mmap SQEs: %w", err))
	}
	at := func(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&u.ring[off])) }
	u.sqTail, u.sqMask, u.sqArray = at(p.sqOff.tail), at(p.sqOff.ringMask), unsafe.Pointer(&u.ring[p.sqOff.array])
	u.cqHead, u.cqTail, u.cqMask, u.cqes = at(p.cqOff.head), at(p.cqOff.tail), at(p.cqOff.ringMask), unsafe.Pointer(&u.ring[p.cqOff.cqes])
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return fail(fmt.Errorf("io_uring: eventfd: %w", err))
	}
	u.ev = os.NewFile(uintptr(efd), "io_uring-eventfd")
	e := int32(efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, fd, ioringRegisterEventfd, uintptr(unsafe.Pointer(&e)), 1, 0, 0); errno != 0 {
		return fail(fmt.Errorf("io_uring_register eventfd: %w", errno))
	}
	return u, nil
}

func (u *uring) close() {
	if u.ev != nil {
		u.ev.Close()
	}
	if u.sqes != nil {
		unix.Munmap(u.sqes)
	}
	if u.ring != nil {
		unix.Munmap(u.ring)
	}
	unix.Close(u.fd)
}

// fsync fsyncs the file whose descriptor is fd, which the caller keeps
// open until it returns. With ok it returns fsync(2)'s error for the file;
// without, the ring could not run the fsync (or cannot tell whether it
// ran), err says why, and the caller must fsync another way. After that
// the ring stays broken and every call returns !ok.
func (u *uring) fsync(fd int) (ok bool, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.broken != nil {
		return false, u.broken
	}
	defer func() {
		if !ok {
			u.broken = err
		}
	}()
	tail := atomic.LoadUint32(u.sqTail)
	i := tail & *u.sqMask
	sqe := u.sqes[i*sqeSize : (i+1)*sqeSize]
	clear(sqe)
	sqe[0] = ioringOpFsync
	*(*int32)(unsafe.Pointer(&sqe[4])) = int32(fd)
	*(*uint32)(unsafe.Add(u.sqArray, 4*i)) = i
	atomic.StoreUint32(u.sqTail, tail+1)
	// The kernel cannot fsync without blocking, so it hands the operation
	// to a worker thread and returns at once.
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(u.fd), 1, 0, 0, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 || n != 1 {
			return false, fmt.Errorf("io_uring_enter: submitted %d of 1: %v", n, errno)
		}
		break
	}
	return u.wait(time.Now().Add(ringWait))
}

// ringWait bounds the wait for an fsync's completion. Past it the ring is
// given up (an fsync(2) follows, so a slow disk costs a second fsync, never
// durability): a CI run once saw three rings in one process wait minutes
// for completions that never came, each holding its segment's descriptor
// (and so Close and Rotate) meanwhile.
var ringWait = 2 * time.Second

// wait returns the result of the one operation in flight, waiting for it
// until deadline.
func (u *uring) wait(deadline time.Time) (ok bool, err error) {
	for {
		head := atomic.LoadUint32(u.cqHead)
		if head != atomic.LoadUint32(u.cqTail) {
			cqe := unsafe.Add(u.cqes, cqeSize*(head&*u.cqMask))
			res := *(*int32)(unsafe.Add(cqe, 8))
			atomic.StoreUint32(u.cqHead, head+1)
			if res < 0 {
				return true, unix.Errno(-res)
			}
			return true, nil
		}
		// Wait for the completion's eventfd signal, parked in the netpoller.
		if err := u.ev.SetReadDeadline(deadline); err != nil {
			return false, fmt.Errorf("io_uring eventfd: %w", err)
		}
		if _, err := u.ev.Read(u.buf[:]); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return false, fmt.Errorf("io_uring: no completion within %v of an fsync", ringWait)
			}
			return false, fmt.Errorf("io_uring eventfd: %w", err)
		}
	}
}
