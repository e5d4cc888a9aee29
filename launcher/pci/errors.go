package pci

import "strings"

// ListError is several errors reported as one line ("; "-separated), as a
// step's error file wants them (GPUs, VFs). errors.Is and errors.As look
// into each.
type ListError struct {
	// What prefixes the line ("GPUs 0,1").
	What string
	Errs []error
}

func (e *ListError) Error() string {
	parts := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		parts[i] = err.Error()
	}
	s := strings.Join(parts, "; ")
	if e.What != "" {
		s = e.What + ": " + s
	}
	return s
}

// Unwrap returns the errors.
func (e *ListError) Unwrap() []error { return e.Errs }

// JoinErrors is nil for no errors, the error itself for one (when what is
// empty), a *ListError otherwise.
func JoinErrors(what string, errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		if what == "" {
			return errs[0]
		}
	}
	return &ListError{What: what, Errs: errs}
}
