// linear kernels (see mod.rs); empty until the family is written.
