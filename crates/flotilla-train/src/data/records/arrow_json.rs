//! One row of an Arrow record batch as the JSON object it was written from: strings, numbers,
//! booleans and nulls as themselves, lists as arrays, structs and maps as objects (fields in
//! schema order), dictionary-encoded columns by their values. A struct field that is null in
//! a row is a JSON null, as `datasets` reads it (pyarrow gives every struct of a column the
//! union of the fields its rows had); the chat template leaves such keys out, as transformers
//! does.
//!
//! Columns of types no JSON record holds (binary, dates, times, decimals, unions) are left out
//! of the object; [`unreadable_columns`] names them so that the reader can say why a key a
//! format needs is missing.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
    UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use serde_json::{Map, Number, Value};

/// Whether values of `t` become JSON (recursively for nested types).
pub fn readable(t: &DataType) -> bool {
    match t {
        DataType::Null
        | DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            readable(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().all(|f| readable(f.data_type())),
        DataType::Map(entries, _) => readable(entries.data_type()),
        DataType::Dictionary(_, values) => readable(values),
        _ => false,
    }
}

/// `(name, type)` of each column of `batch` that [`row`] leaves out.
pub fn unreadable_columns(batch: &RecordBatch) -> Vec<(String, String)> {
    batch
        .schema()
        .fields()
        .iter()
        .filter(|f| !readable(f.data_type()))
        .map(|f| (f.name().clone(), f.data_type().to_string()))
        .collect()
}

/// Row `i` of `batch` as a JSON object of its readable columns.
pub fn row(batch: &RecordBatch, i: usize) -> Value {
    let schema = batch.schema();
    let mut object = Map::with_capacity(batch.num_columns());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if readable(field.data_type()) {
            object.insert(field.name().clone(), value(column.as_ref(), i));
        }
    }
    Value::Object(object)
}

fn number(n: Option<Number>) -> Value {
    n.map_or(Value::Null, Value::Number)
}

/// Element `i` of `array` (of a readable type) as JSON.
pub fn value(array: &dyn Array, i: usize) -> Value {
    if array.is_null(i) {
        return Value::Null;
    }
    match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(i)),
        DataType::Int8 => array.as_primitive::<Int8Type>().value(i).into(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(i).into(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(i).into(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(i).into(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(i).into(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(i).into(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(i).into(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(i).into(),
        DataType::Float16 => number(Number::from_f64(
            array.as_primitive::<Float16Type>().value(i).to_f64(),
        )),
        DataType::Float32 => number(Number::from_f64(
            array.as_primitive::<Float32Type>().value(i) as f64,
        )),
        DataType::Float64 => number(Number::from_f64(
            array.as_primitive::<Float64Type>().value(i),
        )),
        DataType::Utf8 => Value::String(array.as_string::<i32>().value(i).to_owned()),
        DataType::LargeUtf8 => Value::String(array.as_string::<i64>().value(i).to_owned()),
        DataType::Utf8View => Value::String(array.as_string_view().value(i).to_owned()),
        DataType::List(_) => items(array.as_list::<i32>().value(i).as_ref()),
        DataType::LargeList(_) => items(array.as_list::<i64>().value(i).as_ref()),
        DataType::FixedSizeList(..) => items(array.as_fixed_size_list().value(i).as_ref()),
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let mut object = Map::with_capacity(fields.len());
            for (field, column) in fields.iter().zip(s.columns()) {
                object.insert(field.name().clone(), value(column.as_ref(), i));
            }
            Value::Object(object)
        }
        DataType::Map(..) => {
            let entries = array.as_map().value(i);
            let (keys, values) = (entries.column(0), entries.column(1));
            let mut object = Map::with_capacity(entries.len());
            for k in 0..entries.len() {
                let key = match value(keys.as_ref(), k) {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                object.insert(key, value(values.as_ref(), k));
            }
            Value::Object(object)
        }
        DataType::Dictionary(..) => {
            let d = array.as_any_dictionary();
            match value(d.keys(), i).as_u64() {
                Some(key) => value(d.values().as_ref(), key as usize),
                None => Value::Null,
            }
        }
        _ => Value::Null,
    }
}

fn items(list: &dyn Array) -> Value {
    Value::Array((0..list.len()).map(|k| value(list, k)).collect())
}
