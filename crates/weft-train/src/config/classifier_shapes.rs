//! A classifier's (mlp, convnet) `[model]` keys checked against the shapes of the tensors it is
//! to be loaded from, before anything of the config's size is built, as a language model's are
//! (`GptConfig::check_shapes`): a checkpoint's index.json edited to `hidden = [1073741824]` made
//! `weft export onnx` build a model of that width, allocating until the kernel killed it.

use std::collections::BTreeMap;

use weft_core::{Error, Result};

use super::{ConvnetKeys, MlpKeys};

fn invalid(msg: String) -> Error {
    Error::Invalid {
        op: "model config",
        msg,
    }
}

/// One dimension of a parameter's expected shape.
struct Dim {
    /// The `[model]` key it comes from (named when the shapes disagree); `None` for a size
    /// no key sets (a convolution's 3x3 kernel).
    key: Option<&'static str>,
    /// How messages write it (`hidden[0]`, `in_features`).
    symbol: String,
    size: usize,
}

fn dim(key: &'static str, symbol: impl Into<String>, size: usize) -> Dim {
    Dim {
        key: Some(key),
        symbol: symbol.into(),
        size,
    }
}

/// Checks that `shapes` holds `name` with the shape `dims` give. The error names the parameter
/// missing, or the key of the first dimension that disagrees (the first dimension's when the
/// ranks differ) with its value (`value(key)`).
fn check_param(
    shapes: &BTreeMap<String, Vec<usize>>,
    name: &str,
    dims: &[Dim],
    value: &dyn Fn(&str) -> String,
) -> Result<()> {
    let want: Vec<usize> = dims.iter().map(|d| d.size).collect();
    let symbols: Vec<&str> = dims.iter().map(|d| d.symbol.as_str()).collect();
    let symbolic = format!("[{}]", symbols.join(", "));
    let Some(have) = shapes.get(name) else {
        return Err(invalid(format!(
            "the state dict has no {name} (of shape {symbolic} = {want:?})"
        )));
    };
    let culprit = if have.len() != dims.len() {
        dims.first()
    } else {
        dims.iter().zip(have).find(|(d, h)| **h != d.size).map(|(d, _)| d)
    };
    match culprit.map(|d| d.key) {
        None => Ok(()),
        Some(Some(key)) => Err(invalid(format!(
            "model.{key}: {}, but {name} has shape {have:?}, not {symbolic} = {want:?}",
            value(key)
        ))),
        Some(None) => Err(invalid(format!("{name} has shape {have:?}, not {symbolic} = {want:?}"))),
    }
}

/// The parameters named `{prefix}{i}.…` must have `i < count`: the first past it (with its
/// shape) is an error naming `key` and its value.
fn no_more_than(
    shapes: &BTreeMap<String, Vec<usize>>,
    prefix: &str,
    count: usize,
    unit: &str,
    key: &str,
    value: &str,
) -> Result<()> {
    let index = |n: &str| -> Option<usize> { n.strip_prefix(prefix)?.split('.').next()?.parse().ok() };
    match shapes.iter().find(|(n, _)| index(n).is_some_and(|i| i >= count)) {
        Some((name, shape)) => Err(invalid(format!(
            "model.{key}: {value} makes {count} {unit}(s), but the state dict holds {name} of shape {shape:?}"
        ))),
        None => Ok(()),
    }
}

/// An mlp's keys against `shapes`: its sizes as the model checks them, then `layers.{i}.weight`
/// `[out, in]` and `layers.{i}.bias` `[out]` of every Linear (`in_features`, the `hidden`
/// widths, `out_features` in turn), and no Linear past the last.
pub(super) fn check_mlp(m: &MlpKeys, shapes: &BTreeMap<String, Vec<usize>>) -> Result<()> {
    m.to_config()?.validate()?;
    let value = |key: &str| match key {
        "in_features" => m.in_features.to_string(),
        "out_features" => m.out_features.to_string(),
        _ => format!("{:?}", m.hidden),
    };
    let layers = m.hidden.len() + 1;
    no_more_than(shapes, "layers.", layers, "layer", "hidden", &value("hidden"))?;
    for i in 0..layers {
        let (key, symbol, size) = match m.hidden.get(i) {
            Some(&h) => ("hidden", format!("hidden[{i}]"), h),
            None => ("out_features", "out_features".to_string(), m.out_features),
        };
        let out = || dim(key, symbol.clone(), size);
        let input = match i {
            0 => dim("in_features", "in_features", m.in_features),
            _ => dim("hidden", format!("hidden[{}]", i - 1), m.hidden[i - 1]),
        };
        check_param(shapes, &format!("layers.{i}.weight"), &[out(), input], &value)?;
        check_param(shapes, &format!("layers.{i}.bias"), &[out()], &value)?;
    }
    Ok(())
}

/// A convnet's keys against `shapes`: its sizes as the model checks them, then every stage's
/// `convs.{i}.weight` `[channels[i], in, 3, 3]` and `convs.{i}.bias`, no stage past the last,
/// and `fc.weight` `[num_classes, channels[-1] x side^2]` (`side` = `image_size` halved once a
/// stage) and `fc.bias`.
pub(super) fn check_convnet(c: &ConvnetKeys, shapes: &BTreeMap<String, Vec<usize>>) -> Result<()> {
    c.to_config().validate()?;
    let value = |key: &str| match key {
        "in_channels" => c.in_channels.to_string(),
        "image_size" => c.image_size.to_string(),
        "num_classes" => c.num_classes.to_string(),
        _ => format!("{:?}", c.channels),
    };
    let stages = c.channels.len();
    no_more_than(shapes, "convs.", stages, "stage", "channels", &value("channels"))?;
    for (i, &ch) in c.channels.iter().enumerate() {
        let input = match i {
            0 => dim("in_channels", "in_channels", c.in_channels),
            _ => dim("channels", format!("channels[{}]", i - 1), c.channels[i - 1]),
        };
        let kernel = || Dim {
            key: None,
            symbol: "3".into(),
            size: 3,
        };
        let out = || dim("channels", format!("channels[{i}]"), ch);
        check_param(
            shapes,
            &format!("convs.{i}.weight"),
            &[out(), input, kernel(), kernel()],
            &value,
        )?;
        check_param(shapes, &format!("convs.{i}.bias"), &[out()], &value)?;
    }
    // validate() has checked that image_size divides by 2^stages
    let side = c.image_size >> stages;
    let last = c.channels[stages - 1];
    let features = side
        .checked_mul(side)
        .and_then(|s| s.checked_mul(last))
        .ok_or_else(|| {
            invalid(format!(
                "model.image_size: {} makes channels[-1] x (image_size / 2^{stages})^2 features for fc, more than \
                 a tensor can hold",
                c.image_size
            ))
        })?;
    let classes = || dim("num_classes", "num_classes", c.num_classes);
    let symbol = format!("channels[-1] x (image_size / 2^{stages})^2");
    check_param(
        shapes,
        "fc.weight",
        &[classes(), dim("image_size", symbol, features)],
        &value,
    )?;
    check_param(shapes, "fc.bias", &[classes()], &value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(list: &[(&str, &[usize])]) -> BTreeMap<String, Vec<usize>> {
        list.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect()
    }

    fn mlp(hidden: &[usize]) -> MlpKeys {
        MlpKeys {
            in_features: 3,
            hidden: hidden.to_vec(),
            out_features: 2,
            activation: "relu".into(),
        }
    }

    #[test]
    fn an_mlp_config_is_checked_against_its_tensors() {
        let sd = shapes(&[
            ("layers.0.weight", &[8, 3]),
            ("layers.0.bias", &[8]),
            ("layers.1.weight", &[2, 8]),
            ("layers.1.bias", &[2]),
        ]);
        check_mlp(&mlp(&[8]), &sd).unwrap();
        let e = check_mlp(&mlp(&[1 << 30]), &sd).unwrap_err().to_string();
        assert!(
            e.contains(
                "model.hidden: [1073741824], but layers.0.weight has shape [8, 3], not [hidden[0], in_features]"
            ),
            "{e}"
        );
        let mut other = mlp(&[8]);
        other.out_features = 5;
        let e = check_mlp(&other, &sd).unwrap_err().to_string();
        assert!(e.contains("model.out_features: 5, but layers.1.weight"), "{e}");
        other = mlp(&[8]);
        other.in_features = 4;
        let e = check_mlp(&other, &sd).unwrap_err().to_string();
        assert!(e.contains("model.in_features: 4, but layers.0.weight"), "{e}");
        // fewer layers than the tensors, or more
        let e = check_mlp(&mlp(&[]), &sd).unwrap_err().to_string();
        assert!(
            e.contains("model.hidden: [] makes 1 layer(s), but the state dict holds layers.1.bias"),
            "{e}"
        );
        let e = check_mlp(&mlp(&[8, 8]), &sd).unwrap_err().to_string();
        assert!(e.contains("model.hidden: [8, 8], but layers.1.weight"), "{e}");
        // the sizes as the model checks them, before any shape
        let mut bad = mlp(&[8]);
        bad.activation = "swish".into();
        let e = check_mlp(&bad, &sd).unwrap_err().to_string();
        assert!(e.contains("model.activation: \"swish\""), "{e}");
        // another model's tensors
        let gpt = shapes(&[("transformer.wte.weight", &[64, 16])]);
        let e = check_mlp(&mlp(&[8]), &gpt).unwrap_err().to_string();
        assert!(e.contains("the state dict has no layers.0.weight"), "{e}");
    }

    #[test]
    fn a_convnet_config_is_checked_against_its_tensors() {
        let keys = ConvnetKeys {
            in_channels: 1,
            image_size: 8,
            channels: vec![4, 6],
            num_classes: 3,
        };
        let sd = shapes(&[
            ("convs.0.weight", &[4, 1, 3, 3]),
            ("convs.0.bias", &[4]),
            ("convs.1.weight", &[6, 4, 3, 3]),
            ("convs.1.bias", &[6]),
            ("fc.weight", &[3, 24]),
            ("fc.bias", &[3]),
        ]);
        check_convnet(&keys, &sd).unwrap();
        let mut k = keys.clone();
        k.channels = vec![4, 1 << 16];
        let e = check_convnet(&k, &sd).unwrap_err().to_string();
        assert!(e.contains("model.channels: [4, 65536], but convs.1.weight"), "{e}");
        k = keys.clone();
        k.image_size = 16;
        let e = check_convnet(&k, &sd).unwrap_err().to_string();
        assert!(
            e.contains("model.image_size: 16, but fc.weight has shape [3, 24]"),
            "{e}"
        );
        k.image_size = 1 << 40;
        let e = check_convnet(&k, &sd).unwrap_err().to_string();
        assert!(e.contains("model.image_size: 1099511627776 makes"), "{e}");
        k = keys.clone();
        k.channels = vec![4];
        let e = check_convnet(&k, &sd).unwrap_err().to_string();
        assert!(e.contains("model.channels: [4] makes 1 stage(s)"), "{e}");
        k = keys.clone();
        k.num_classes = 10;
        let e = check_convnet(&k, &sd).unwrap_err().to_string();
        assert!(e.contains("model.num_classes: 10, but fc.weight"), "{e}");
        let mut five = sd.clone();
        five.insert("convs.0.weight".into(), vec![4, 1, 5, 5]);
        let e = check_convnet(&keys, &five).unwrap_err().to_string();
        assert!(
            e.contains("convs.0.weight has shape [4, 1, 5, 5], not [channels[0], in_channels, 3, 3]"),
            "{e}"
        );
    }
}
