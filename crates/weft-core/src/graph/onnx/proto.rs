//! The ONNX protobuf messages an export writes, encoded by hand: `ModelProto`, `GraphProto`,
//! `NodeProto`, `AttributeProto`, `TensorProto`, `ValueInfoProto` and the messages inside them
//! (`OperatorSetIdProto`, `StringStringEntryProto`, `TypeProto` and its `Tensor`,
//! `TensorShapeProto` and its `Dimension`). Field numbers are those
//! of `onnx/onnx.proto` (the ONNX repository's schema, IR version 8). Repeated scalars are
//! written unpacked, which every protobuf reader accepts for a proto2 schema.
//!
//! Writing the messages here (a few hundred bytes of schema) keeps protobuf code generation
//! and its build-time compiler out of the build; readers (tract in the tests, onnxruntime in
//! `tools/`) check the result.

/// ONNX `TensorProto.DataType` codes.
pub(crate) mod data_type {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
    pub const FLOAT16: i32 = 10;
    pub const DOUBLE: i32 = 11;
    pub const BFLOAT16: i32 = 16;
}

/// A protobuf message being written.
#[derive(Default)]
pub(crate) struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint((u64::from(field) << 3) | u64::from(wire));
    }

    /// A varint field (int32, int64, enum; negative values as ten bytes, as protobuf does).
    pub(crate) fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.key(field, 0);
        self.varint(v as u64);
        self
    }

    /// A bytes (or string) field.
    pub(crate) fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.varint(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }

    pub(crate) fn string(&mut self, field: u32, v: &str) -> &mut Self {
        self.bytes(field, v.as_bytes())
    }

    /// An embedded message field.
    pub(crate) fn msg(&mut self, field: u32, m: &Msg) -> &mut Self {
        self.bytes(field, &m.0)
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// One attribute of a node.
#[derive(Clone, Debug)]
pub(crate) enum Attr {
    Int(i64),
    Ints(Vec<i64>),
    Tensor(Tensor),
}

/// `AttributeProto`.
fn attribute(name: &str, a: &Attr) -> Msg {
    let mut m = Msg::default();
    m.string(1, name);
    match a {
        Attr::Int(i) => {
            m.int(3, *i).int(20, 2);
        }
        Attr::Tensor(t) => {
            m.msg(5, &t.encode()).int(20, 4);
        }
        Attr::Ints(v) => {
            for &i in v {
                m.int(8, i);
            }
            m.int(20, 7);
        }
    }
    m
}

/// `TensorProto`: a named constant with its dims and little-endian raw bytes.
#[derive(Clone, Debug)]
pub(crate) struct Tensor {
    pub name: String,
    pub dims: Vec<i64>,
    pub data_type: i32,
    pub raw: Vec<u8>,
}

impl Tensor {
    fn encode(&self) -> Msg {
        let mut m = Msg::default();
        for &d in &self.dims {
            m.int(1, d);
        }
        m.int(2, i64::from(self.data_type));
        if !self.name.is_empty() {
            m.string(8, &self.name);
        }
        m.bytes(9, &self.raw);
        m
    }
}

/// `NodeProto`.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub op_type: &'static str,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub name: String,
    pub attrs: Vec<(&'static str, Attr)>,
}

impl Node {
    fn encode(&self) -> Msg {
        let mut m = Msg::default();
        for i in &self.inputs {
            m.string(1, i);
        }
        for o in &self.outputs {
            m.string(2, o);
        }
        m.string(3, &self.name).string(4, self.op_type);
        for (name, a) in &self.attrs {
            m.msg(5, &attribute(name, a));
        }
        m
    }
}

/// One dimension of a graph input's or output's shape.
#[derive(Clone, Debug)]
pub(crate) enum Dim {
    Fixed(i64),
    Named(String),
}

/// `ValueInfoProto` of a tensor: name, element type, shape.
#[derive(Clone, Debug)]
pub(crate) struct ValueInfo {
    pub name: String,
    pub data_type: i32,
    pub dims: Vec<Dim>,
    pub doc: String,
}

impl ValueInfo {
    fn encode(&self) -> Msg {
        let mut shape = Msg::default();
        for d in &self.dims {
            let mut dim = Msg::default();
            match d {
                Dim::Fixed(v) => dim.int(1, *v),
                Dim::Named(s) => dim.string(2, s),
            };
            shape.msg(1, &dim);
        }
        let mut tensor = Msg::default();
        tensor.int(1, i64::from(self.data_type)).msg(2, &shape);
        let mut ty = Msg::default();
        ty.msg(1, &tensor);
        let mut m = Msg::default();
        m.string(1, &self.name).msg(2, &ty);
        if !self.doc.is_empty() {
            m.string(3, &self.doc);
        }
        m
    }
}

/// A whole model: one graph, the default domain at `opset`.
pub(crate) struct Model {
    pub graph_name: String,
    pub doc: String,
    pub opset: i64,
    pub nodes: Vec<Node>,
    pub initializers: Vec<Tensor>,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    pub metadata: Vec<(String, String)>,
}

/// The IR version that goes with opsets 17 and 18.
const IR_VERSION: i64 = 8;

impl Model {
    /// The `ModelProto` bytes (a `.onnx` file).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut g = Msg::default();
        for n in &self.nodes {
            g.msg(1, &n.encode());
        }
        g.string(2, &self.graph_name);
        for t in &self.initializers {
            g.msg(5, &t.encode());
        }
        if !self.doc.is_empty() {
            g.string(10, &self.doc);
        }
        for v in &self.inputs {
            g.msg(11, &v.encode());
        }
        for v in &self.outputs {
            g.msg(12, &v.encode());
        }
        let mut opset = Msg::default();
        opset.string(1, "").int(2, self.opset);
        let mut m = Msg::default();
        m.int(1, IR_VERSION)
            .string(2, "weft")
            .string(3, env!("CARGO_PKG_VERSION"))
            .msg(7, &g)
            .msg(8, &opset);
        if !self.doc.is_empty() {
            m.string(6, &self.doc);
        }
        for (k, v) in &self.metadata {
            let mut e = Msg::default();
            e.string(1, k).string(2, v);
            m.msg(14, &e);
        }
        m.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_keys_are_protobuf_encoded() {
        let mut m = Msg::default();
        m.int(1, 150);
        assert_eq!(m.0, [0x08, 0x96, 0x01]);
        let mut m = Msg::default();
        m.int(2, -1);
        assert_eq!(m.0.len(), 11);
        assert_eq!(&m.0[..2], &[0x10, 0xff]);
        assert_eq!(m.0[10], 0x01);
        let mut m = Msg::default();
        m.string(2, "testing");
        assert_eq!(m.0, [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']);
    }

    #[test]
    fn attributes_are_encoded_as_onnx_attribute_protos() {
        // name (1) "axis", i (3) 0, type (20) INT = 2
        let a = attribute("axis", &Attr::Int(0));
        assert_eq!(a.0, [0x0a, 0x04, b'a', b'x', b'i', b's', 0x18, 0x00, 0xa0, 0x01, 0x02]);
        // name "perm", ints (8) 1 and 0 unpacked, type INTS = 7
        let a = attribute("perm", &Attr::Ints(vec![1, 0]));
        assert_eq!(
            a.0,
            [0x0a, 0x04, b'p', b'e', b'r', b'm', 0x40, 0x01, 0x40, 0x00, 0xa0, 0x01, 0x07]
        );
    }
}
