//! CSV parsing through the `csv` crate: quoted fields, and line numbers that count blank lines.

use std::path::Path;

use weft_data::{CsvDataset, Error, LabelColumn};

fn load(text: &str, label: LabelColumn) -> weft_data::Result<CsvDataset> {
    CsvDataset::from_csv_text(text, Path::new("q.csv"), label, 1.0, 0.0, 0)
}

#[test]
fn quoted_fields_are_unquoted() {
    let d = load(
        "\"width, cm\",\"label\"\n\"1.5\",\"2\"\n3, 0\n",
        LabelColumn::Name("label".into()),
    )
    .unwrap();
    assert_eq!(d.header().unwrap(), ["width, cm", "label"]);
    assert_eq!(d.num_features(), 1);
    assert_eq!(d.num_classes(), 3);
}

#[test]
fn error_lines_count_blank_and_whitespace_lines() {
    for (text, line) in [
        ("1,2,0\n\n\n\n3,x,1\n", 5),
        ("1,2,0\r\n\r\n   \r\n3,x,1\r\n", 4),
        ("\n\n1,2,0\n  \n\n3,4,1\n5,y,2\n", 7),
        ("\u{feff}a,b,c\n\n1,2,z\n", 3),
    ] {
        match load(text, LabelColumn::Last) {
            Err(Error::Csv { line: got, .. }) => assert_eq!(got, line, "{text:?}"),
            other => panic!("{text:?}: expected a CSV error, got {other:?}"),
        }
    }
}
