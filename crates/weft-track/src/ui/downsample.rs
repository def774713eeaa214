//! Down-sampling a metric's series for drawing: min and max per bucket, so a million-point
//! curve arrives as at most `max_points` points that keep its spikes.

/// At most `max_points` of `points` (sorted by step): the first and the last, and between them
/// the lowest and the highest value of each of `(max_points - 2) / 2` equal buckets, in their
/// order. A series that fits is returned whole; `max_points` below 4 counts as 4.
pub fn min_max<T: Copy>(points: &[T], max_points: usize, value: impl Fn(&T) -> f64) -> Vec<T> {
    let max_points = max_points.max(4);
    let n = points.len();
    if n <= max_points {
        return points.to_vec();
    }
    let inner = &points[1..n - 1];
    let buckets = (max_points - 2) / 2;
    let mut out = Vec::with_capacity(max_points);
    out.push(points[0]);
    for b in 0..buckets {
        let (lo, hi) = (b * inner.len() / buckets, (b + 1) * inner.len() / buckets);
        if lo == hi {
            continue;
        }
        // NaN never wins either comparison, so a bucket of NaNs keeps its first point
        let (mut min, mut max) = (lo, lo);
        for (i, p) in inner.iter().enumerate().take(hi).skip(lo) {
            let v = value(p);
            if v < value(&inner[min]) || value(&inner[min]).is_nan() {
                min = i;
            }
            if v > value(&inner[max]) || value(&inner[max]).is_nan() {
                max = i;
            }
        }
        out.push(inner[min.min(max)]);
        if min != max {
            out.push(inner[min.max(max)]);
        }
    }
    out.push(points[n - 1]);
    out
}

#[cfg(test)]
mod tests {
    use super::min_max;

    #[test]
    fn keeps_ends_and_extremes_within_the_limit() {
        let points: Vec<(i64, f64)> = (0..1_000_000).map(|i| (i, ((i as f64) * 0.001).sin())).collect();
        let mut spiky = points.clone();
        spiky[123_457].1 = 50.0;
        spiky[765_433].1 = -50.0;
        let out = min_max(&spiky, 1000, |p| p.1);
        assert!(out.len() <= 1000 && out.len() > 900, "{}", out.len());
        assert_eq!(out[0], spiky[0]);
        assert_eq!(*out.last().unwrap(), spiky[999_999]);
        assert!(out.contains(&spiky[123_457]) && out.contains(&spiky[765_433]));
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "in step order");
        let small = &points[..10];
        assert_eq!(min_max(small, 1000, |p| p.1), small);
        assert_eq!(min_max(&points[..100], 1, |p| p.1).len(), 4);
    }
}
