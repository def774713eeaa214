// conv kernels (see mod.rs); empty until the family is written.
