package image

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error returned by Prepare, Check, List and Remove
// that concerns the image itself wraps exactly one of them, so callers test
// the class with errors.Is and show Error() to the user unchanged.
var (
	// ErrNotFound: the local path does not exist, or the registry does not
	// know the repository or tag.
	ErrNotFound = errors.New("image not found")
	// ErrPermission: the job's user may not read the path, or the registry
	// requires credentials.
	ErrPermission = errors.New("permission denied")
	// ErrCorrupt: the input exists but is truncated or malformed (bad tar,
	// bad JSON, a blob whose digest does not match, a broken squashfs).
	ErrCorrupt = errors.New("corrupt image")
	// ErrUnsupported: the input is readable but of a kind this package does
	// not convert (compressed tar, a tar that is not an image, several images
	// in one archive, another platform).
	ErrUnsupported = errors.New("unsupported image")
	// ErrInvalidRef: the reference is not a valid registry reference.
	ErrInvalidRef = errors.New("invalid image reference")
	// ErrChanged: the local input changed while it was being read (its
	// digest at conversion time differs from the one it had when probed).
	ErrChanged = errors.New("image changed while being read")
	// ErrRegistry: the registry could not be reached or answered with an
	// unexpected error.
	ErrRegistry = errors.New("registry error")
	// ErrLimit: converting the image would pass one of the node's Limits
	// (its unpacked size, a layer's size, its number of entries, the
	// user's cache quota); the message names the microvm.toml key.
	ErrLimit = errors.New("image too large")
)

// Error is the error type of this package: the user's input, what went
// wrong, and the rule or fix, rendered as
//
//	image "/x/y.tar": no such file (a local image must be ...)
type Error struct {
	Ref    string // what the user passed, verbatim
	Class  error  // one of the Err* sentinels
	Detail string // what went wrong, lower case, no trailing period
	Hint   string // the rule or the fix; may be empty
	Err    error  // underlying cause; may be nil

	// cacheFull marks a conversion that ran out of cache space
	// (budget.quotaErr): prepareCached prunes further and tries again.
	cacheFull bool
}

// isCacheFull says whether err is a conversion's lack of cache space.
func isCacheFull(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.cacheFull
}

func (e *Error) Error() string {
	s := fmt.Sprintf("image %q: %s", e.Ref, e.Detail)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// Unwrap exposes both the class and the cause to errors.Is / errors.As.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Class}
	}
	return []error{e.Class, e.Err}
}

// Hints shared by several errors.
const (
	hintLocal = "a local image must be an existing OCI archive, OCI layout, squashfs file or root filesystem directory"
	hintRead  = "the file must be readable by the job's user; check its permissions and those of every directory above it"
	hintRef   = "a local image path must be absolute or start with ./ or ../; anything else is a registry reference such as docker://registry.example.com/repo:tag"
)

func newErr(ref string, class error, detail, hint string, cause error) *Error {
	return &Error{Ref: ref, Class: class, Detail: detail, Hint: hint, Err: cause}
}

// withRef returns err with Ref set when err is an *Error without one.
func withRef(ref string, err error) error {
	var e *Error
	if errors.As(err, &e) && e.Ref == "" {
		c := *e
		c.Ref = ref
		return &c
	}
	return err
}
