"""The mutation check: named defects planted one at a time in a throwaway copy of the tree, the
tests that should notice each run against it (`python -m tests.mutation [--fast]`; the list and
the last results in docs/mutation.md). A mutant is caught when those tests fail."""
