//! Starting and watching the workers of a job (`weft launch`).
