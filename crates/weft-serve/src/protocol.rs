//! The Open Inference Protocol's (KServe v2) JSON tensors: requests, responses, the models'
//! metadata, and turning `data` (flat row-major, or nested arrays) into weft tensors.

use serde::{Deserialize, Serialize};
use weft_core::Tensor;

use crate::error::ApiError;
use crate::json::TensorData;
use crate::registry::{Served, Signature};

/// The name of a classifier's input, and of every model's output.
pub const FEATURES: &str = "input";
/// The name of a language model's input.
pub const TOKEN_IDS: &str = "input_ids";
/// The name of every model's output.
pub const LOGITS: &str = "logits";

/// `POST .../infer`'s body: the Open Inference Protocol's fields, and no others (a field it
/// does not define is refused, 400 naming it, rather than ignored).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferRequest {
    /// The client's id of the request, given back in the answer.
    #[serde(default)]
    pub id: Option<String>,
    /// The request's parameters ([`InferParameters`]).
    #[serde(default)]
    pub parameters: Option<InferParameters>,
    pub inputs: Vec<RequestInput>,
    /// The outputs wanted (all when absent).
    #[serde(default)]
    pub outputs: Option<Vec<RequestOutput>>,
}

/// The parameters of an infer request that weft knows; any other is refused (400 naming it):
/// Triton's `priority`, `timeout`, `sequence_id` and the like ask for what weft does not do.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferParameters {
    /// Triton's binary data extension: every output as binary after the JSON. Taken, and
    /// answered in JSON whatever its value (a server without the extension answers JSON, which
    /// Triton's clients read); tritonclient sends `true` when the request lists no outputs.
    pub binary_data_output: Option<bool>,
    /// MLServer's codec hint (`"np"`, `"pd"`): taken; the data is read by its `datatype`.
    pub content_type: Option<String>,
    /// MLServer's request headers, passed along as a parameter: taken, not read.
    pub headers: Option<serde_json::Value>,
}

/// One input tensor: `data` holds `shape`'s product of values in row-major order (flat or
/// nested).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestInput {
    pub name: String,
    pub shape: Vec<i64>,
    pub datatype: String,
    /// The input's parameters ([`InputParameters`]).
    #[serde(default)]
    pub parameters: Option<InputParameters>,
    pub data: TensorData,
}

/// The parameters of an input that weft knows; any other is refused (400 naming it).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputParameters {
    /// Triton's binary data extension: the input's bytes follow the JSON. Refused whatever its
    /// value (weft reads `data` as JSON).
    pub binary_data_size: Option<u64>,
    /// MLServer's codec hint (`"np"`): taken; the data is read by its `datatype`.
    pub content_type: Option<String>,
}

/// One wanted output.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestOutput {
    pub name: String,
    /// The output's parameters ([`OutputParameters`]).
    #[serde(default)]
    pub parameters: Option<OutputParameters>,
}

/// The parameters of a wanted output that weft knows; any other is refused (400 naming it):
/// Triton's `classification` and shared memory parameters ask for what weft does not do.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputParameters {
    /// Triton's binary data extension: the output as binary after the JSON. Taken, and
    /// answered in JSON whatever its value (as `binary_data_output`).
    pub binary_data: Option<bool>,
    /// MLServer's codec hint: taken; the output is FP32 as the model's metadata says.
    pub content_type: Option<String>,
}

impl InferRequest {
    /// 400 naming the first input given as binary data (Triton's binary data extension), which
    /// weft cannot read: it reads tensor data as JSON only. Outputs asked for as binary are
    /// answered in JSON, which Triton's clients read as they read a server's without the
    /// extension.
    pub fn refuse_binary_data(&self) -> Result<(), ApiError> {
        const JSON_ONLY: &str = "weft serve reads tensor data as JSON only";
        for (i, input) in self.inputs.iter().enumerate() {
            if let Some(size) = input.parameters.as_ref().and_then(|p| p.binary_data_size) {
                return Err(ApiError::bad_request(format!(
                    "inputs[{i}].parameters.binary_data_size: {size} bytes of binary data; {JSON_ONLY}: \
                     give the values in `data` (tritonclient: set_data_from_numpy(..., binary_data=False))"
                )));
            }
        }
        Ok(())
    }
}

/// One output tensor of a response: FP32 values in row-major order.
#[derive(Debug, Serialize)]
pub struct ResponseOutput {
    pub name: &'static str,
    pub datatype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A tensor's description in the metadata: `-1` marks a dimension of any size.
#[derive(Debug, Serialize)]
pub struct TensorMetadata {
    pub name: &'static str,
    pub datatype: &'static str,
    pub shape: Vec<i64>,
}

/// `(inputs, outputs)` of the metadata of a model with `sig`.
pub fn metadata(sig: Signature) -> (Vec<TensorMetadata>, Vec<TensorMetadata>) {
    let (input, output) = match sig {
        Signature::Features { features, classes } => (
            TensorMetadata {
                name: FEATURES,
                datatype: "FP32",
                shape: vec![-1, features as i64],
            },
            vec![-1, classes as i64],
        ),
        Signature::Images {
            channels,
            size,
            classes,
        } => (
            TensorMetadata {
                name: FEATURES,
                datatype: "FP32",
                shape: vec![-1, channels as i64, size as i64, size as i64],
            },
            vec![-1, classes as i64],
        ),
        Signature::Tokens { vocab, .. } => (
            TensorMetadata {
                name: TOKEN_IDS,
                datatype: "INT64",
                shape: vec![-1, -1],
            },
            vec![-1, -1, vocab as i64],
        ),
    };
    let output = TensorMetadata {
        name: LOGITS,
        datatype: "FP32",
        shape: output,
    };
    (vec![input], vec![output])
}

/// The model's input tensor from `input`, checked against `served`'s signature: the name, the
/// datatype, the shape (every dimension >= 1, as the metadata gives them), the count of values,
/// each value (FP32 in range; INT64 whole and inside the vocabulary), and the size of the
/// output (at most `max_outputs` values). Errors name the cause.
pub fn input_tensor(served: &Served, input: &RequestInput, max_outputs: usize) -> Result<Tensor, ApiError> {
    let (want_name, want_type) = match served.signature {
        Signature::Tokens { .. } => (TOKEN_IDS, "INT64"),
        _ => (FEATURES, "FP32"),
    };
    if input.name != want_name {
        return Err(ApiError::bad_request(format!(
            "unknown input {:?}: model {} takes one input named {want_name:?}",
            input.name, served.name
        )));
    }
    if input.datatype != want_type {
        return Err(ApiError::bad_request(format!(
            "input {:?}: datatype {:?}, expected {want_type:?}",
            input.name, input.datatype
        )));
    }
    let (meta, _) = metadata(served.signature);
    let want = &meta[0].shape;
    let shape_ok = input.shape.len() == want.len()
        && input
            .shape
            .iter()
            .zip(want)
            .all(|(&g, &w)| g >= 1 && (w == -1 || g == w));
    if !shape_ok {
        return Err(ApiError::bad_request(format!(
            "input {:?}: shape {:?} does not match {want:?} (-1: any size >= 1)",
            input.name, input.shape
        )));
    }
    let shape: Vec<usize> = input.shape.iter().map(|&d| d as usize).collect();
    if let Signature::Tokens { block, .. } = served.signature {
        if shape[1] > block {
            return Err(ApiError::bad_request(format!(
                "input {:?}: {} tokens per row, more than the model's block_size = {block}",
                input.name, shape[1]
            )));
        }
    }
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    // logits [B, classes] of a classifier, [B, T, vocab] of a language model
    let outputs = match served.signature {
        Signature::Tokens { vocab, .. } => count.and_then(|c| c.checked_mul(vocab)),
        Signature::Features { classes, .. } | Signature::Images { classes, .. } => shape[0].checked_mul(classes),
    };
    let (Some(count), Some(outputs)) = (count, outputs) else {
        return Err(ApiError::bad_request(format!(
            "input {:?}: shape {:?} is too large",
            input.name, input.shape
        )));
    };
    if outputs > max_outputs {
        return Err(ApiError::bad_request(format!(
            "input {:?}: shape {:?} gives {outputs} output values, over the limit of {max_outputs}",
            input.name, input.shape
        )));
    }
    // nested arrays must nest as the shape says; flat data is any row-major list
    let data = &input.data;
    if data.nested && data.nesting.as_deref() != Some(&shape[..]) {
        return Err(ApiError::bad_request(format!(
            "input {:?}: data nests as {}, not as shape {:?} (give nested arrays of that shape, or a flat array)",
            input.name,
            data.nesting
                .as_ref()
                .map_or_else(|| "ragged arrays".to_string(), |s| format!("{s:?}")),
            input.shape
        )));
    }
    let values = &data.values;
    if values.len() != count {
        return Err(ApiError::bad_request(format!(
            "input {:?}: data holds {} values, shape {:?} needs {count}",
            input.name,
            values.len(),
            input.shape
        )));
    }
    let bad_value = |i: usize, v: &dyn std::fmt::Display, what: &str| {
        ApiError::bad_request(format!("input {:?}: data[{i}] = {v} is not {what}", input.name))
    };
    let tensor = match served.signature {
        Signature::Tokens { vocab, .. } => {
            if let Some((i, v)) = &data.first_not_whole {
                return Err(not_an_integer(&input.name, *i, v, values[*i]));
            }
            let mut ids = Vec::with_capacity(count);
            for (i, &v) in values.iter().enumerate() {
                // a whole number inside i64 (checked above); past 2^53 rounded, far outside
                // any vocabulary either way
                let id = v as i64;
                if id < 0 || id as u64 >= vocab as u64 {
                    return Err(ApiError::bad_request(format!(
                        "input {:?}: token id {id} at data[{i}] is outside the vocabulary (vocab_size = {vocab})",
                        input.name
                    )));
                }
                ids.push(id);
            }
            Tensor::from_vec(ids, &shape)
        }
        _ => {
            let mut xs = Vec::with_capacity(count);
            for (i, &x) in values.iter().enumerate() {
                if x.abs() > f64::from(f32::MAX) {
                    return Err(bad_value(i, &format!("{x:?}"), "inside FP32's range"));
                }
                xs.push(x as f32);
            }
            Tensor::from_vec(xs, &shape)
        }
    };
    tensor.map_err(|e| ApiError::bad_request(format!("input {:?}: {e}", input.name)))
}

/// Why `value` at `data[i]` of INT64 input `name`, written `text` in the body and not a JSON
/// integer inside i64, is refused: not whole, whole but outside INT64's range (`1e300`), or
/// whole and inside it but written with a decimal point or an exponent (`2.0`, `1e3`).
fn not_an_integer(name: &str, i: usize, text: &str, value: f64) -> ApiError {
    // 2^63: i64's bounds are -2^63 and 2^63 - 1
    const BOUND: f64 = 9_223_372_036_854_775_808.0;
    let why = if !value.is_finite() || value.fract() != 0.0 {
        "is not a whole number (INT64)".to_string()
    } else if value <= -BOUND || value >= BOUND {
        format!("is a whole number outside INT64's range ({} to {})", i64::MIN, i64::MAX)
    } else {
        format!(
            "is written as a decimal: INT64 data takes JSON integers (such as {})",
            value as i64
        )
    };
    ApiError::bad_request(format!("input {name:?}: data[{i}] = {text} {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_marks_dynamic_dimensions() {
        let (i, o) = metadata(Signature::Images {
            channels: 1,
            size: 8,
            classes: 10,
        });
        assert_eq!(
            (i[0].name, i[0].datatype, i[0].shape.clone()),
            (FEATURES, "FP32", vec![-1, 1, 8, 8])
        );
        assert_eq!((o[0].name, o[0].shape.clone()), (LOGITS, vec![-1, 10]));
        let (i, o) = metadata(Signature::Tokens { vocab: 65, block: 16 });
        assert_eq!(
            (i[0].name, i[0].datatype, i[0].shape.clone()),
            (TOKEN_IDS, "INT64", vec![-1, -1])
        );
        assert_eq!(o[0].shape, vec![-1, -1, 65]);
    }

    #[test]
    fn int64_data_that_is_not_a_json_integer_says_why() {
        let s = crate::model::test_gpt();
        let refused = |data: &str| {
            let input = RequestInput {
                name: TOKEN_IDS.into(),
                shape: vec![1, 1],
                datatype: "INT64".into(),
                parameters: None,
                data: serde_json::from_str(data).unwrap(),
            };
            input_tensor(&s, &input, 1 << 20).unwrap_err().message
        };
        for (data, want) in [
            ("[1e300]", "data[0] = 1e300 is a whole number outside INT64's range"),
            ("[-1e19]", "data[0] = -1e19 is a whole number outside INT64's range"),
            (
                "[18446744073709551615]",
                "data[0] = 18446744073709551615 is a whole number outside INT64's range",
            ),
            ("[2.5]", "data[0] = 2.5 is not a whole number (INT64)"),
            (
                "[2.0]",
                "data[0] = 2.0 is written as a decimal: INT64 data takes JSON integers (such as 2)",
            ),
            ("[1e3]", "data[0] = 1000.0 is written as a decimal"),
        ] {
            let m = refused(data);
            assert!(m.contains(want), "{data}: {m}");
        }
    }
}
