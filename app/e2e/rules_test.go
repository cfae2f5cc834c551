package e2e

func ptr[T any](v T) *T { return &v }
