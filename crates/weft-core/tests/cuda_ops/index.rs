//! The index family on a GPU against the CPU (cases to come with the family's kernels).
