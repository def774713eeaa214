//! One check for the store tests: a token dataset read through a store gives what the same
//! dataset in a local folder gives.

use weft_data::{Split, TokenDataset};

/// Checks that `got` reads as `want`: each split's length and tokens (whole, and a range that
/// starts and ends inside shards and blocks), the checksums, the training batches of
/// `batch_size` windows of `block_size` tokens from step 0 past the end of the first epoch, and
/// one validation batch.
pub fn assert_reads_alike(got: &TokenDataset, want: &TokenDataset, batch_size: usize, block_size: usize) {
    for split in [Split::Train, Split::Val] {
        let n = want.tokens(split);
        assert!(n > 4, "{split:?}: {n} tokens");
        assert_eq!(got.tokens(split), n);
        assert_eq!(
            got.read_tokens(split, 0..n).unwrap(),
            want.read_tokens(split, 0..n).unwrap()
        );
        assert_eq!(
            got.read_tokens(split, 3..n - 1).unwrap(),
            want.read_tokens(split, 3..n - 1).unwrap()
        );
    }
    assert_eq!(got.verify().unwrap(), want.verify().unwrap());
    let windows = want.windows(Split::Train, block_size).unwrap();
    let steps = windows / batch_size as u64 + 2;
    for step in 0..steps {
        let (x, y) = got
            .batch(Split::Train, step, batch_size, block_size, 1337, 0..batch_size)
            .unwrap();
        let (wx, wy) = want
            .batch(Split::Train, step, batch_size, block_size, 1337, 0..batch_size)
            .unwrap();
        assert_eq!(x.shape(), &[batch_size, block_size]);
        assert_eq!(x.to_vec::<i64>().unwrap(), wx.to_vec::<i64>().unwrap(), "step {step}");
        assert_eq!(y.to_vec::<i64>().unwrap(), wy.to_vec::<i64>().unwrap(), "step {step}");
    }
    let (xv, _) = got.batch(Split::Val, 0, 2, 2, 1, 0..2).unwrap();
    let (wxv, _) = want.batch(Split::Val, 0, 2, 2, 1, 0..2).unwrap();
    assert_eq!(xv.to_vec::<i64>().unwrap(), wxv.to_vec::<i64>().unwrap());
}
