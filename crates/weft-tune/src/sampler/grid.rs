//! Grid search: trial `n` is point `n` of the product of the parameters' values, the last
//! parameter (in key order) changing fastest.

use super::{Observation, Sampler};
use crate::space::{Space, Value};

/// The product of every parameter's grid points, in order; `None` past its end.
#[derive(Debug, Clone, Copy)]
pub struct Grid;

impl Sampler for Grid {
    fn suggest(&mut self, trial: u64, space: &Space, _history: &[Observation]) -> Option<Vec<Value>> {
        // each axis's value is computed from its index: a long axis is never listed
        let lens: Vec<u64> = space.params.iter().map(|p| p.grid_len()).collect::<Option<_>>()?;
        let mut rest = trial;
        let mut out = vec![Value::Int(0); lens.len()];
        for ((slot, &n), p) in out.iter_mut().zip(&lens).zip(&space.params).rev() {
            *slot = p.grid_point(rest % n);
            rest /= n;
        }
        (rest == 0).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_grid_covers_the_product_once_then_ends() {
        let table: toml::Table = "\"a.x\" = { values = [\"p\", \"q\", \"r\"] }\n\
                                  \"b.y\" = { distribution = \"int_uniform\", min = 1, max = 2 }\n\
                                  \"c.z\" = { distribution = \"uniform\", min = 0.0, max = 1.0, q = 0.5 }\n"
            .parse()
            .unwrap();
        let space = Space::from_toml(&table, "s").unwrap();
        assert_eq!(space.grid_size(), Some(18));
        let points: Vec<Vec<Value>> = (0..18).map(|n| Grid.suggest(n, &space, &[]).unwrap()).collect();
        let text = |v: &Vec<Value>| -> Vec<String> { v.iter().zip(&space.params).map(|(v, p)| p.text(*v)).collect() };
        let distinct: BTreeSet<Vec<String>> = points.iter().map(text).collect();
        assert_eq!(distinct.len(), 18);
        assert_eq!(text(&points[0]), ["\"p\"", "1", "0.0"]);
        assert_eq!(text(&points[1]), ["\"p\"", "1", "0.5"]);
        assert_eq!(text(&points[3]), ["\"p\"", "2", "0.0"]);
        assert_eq!(text(&points[17]), ["\"r\"", "2", "1.0"]);
        assert_eq!(Grid.suggest(18, &space, &[]), None);
    }
}
