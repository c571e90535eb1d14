//! Server-side printing, as kubectl asks for it: `Accept:
//! application/json;as=Table;v=v1;g=meta.k8s.io` turns a get or a list into a `Table`
//! (the `Name` column, then the type's printer columns: a CRD's
//! `additionalPrinterColumns`, typed and with their priorities, so `-o wide` shows the
//! rest), and `as=PartialObjectMetadata[List]` into objects' metadata alone. Each row
//! carries the object's metadata (`includeObject=Metadata`, the default), the whole
//! object (`Object`) or nothing (`None`). Pure: from the objects, no I/O.

use serde_json::{json, Value};

use super::error::ApiError;
use crate::model::printer;
use crate::model::registry::ResourceType;

/// A form of server-side printing and the `meta.k8s.io` version asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    Table(&'static str),
    Metadata(&'static str),
}

/// The form `accept` asks for, the first the client lists that bootplane serves; `None`
/// for plain objects.
pub(crate) fn wanted(accept: &str) -> Option<Form> {
    accept.split(',').find_map(|m| {
        let params: Vec<&str> = m.split(';').map(str::trim).skip(1).collect();
        if !params.contains(&"g=meta.k8s.io") {
            return None;
        }
        let v = ["v1", "v1beta1"]
            .into_iter()
            .find(|v| params.contains(&format!("v={v}").as_str()))?;
        if params.contains(&"as=Table") {
            Some(Form::Table(v))
        } else if params.contains(&"as=PartialObjectMetadataList")
            || params.contains(&"as=PartialObjectMetadata")
        {
            Some(Form::Metadata(v))
        } else {
            None
        }
    })
}

/// What a row carries of its object (`includeObject`).
fn include(q: Option<&str>) -> Result<&'static str, ApiError> {
    match q.unwrap_or("Metadata") {
        "None" => Ok("None"),
        "" | "Metadata" => Ok("Metadata"),
        "Object" => Ok("Object"),
        other => Err(ApiError::bad_request(format!(
            "includeObject: unsupported value {other:?}: supported values are \"None\", \"Metadata\", \"Object\""
        ))),
    }
}

/// `o`'s metadata as a `PartialObjectMetadata` of `meta.k8s.io/<v>`.
fn partial(o: &Value, v: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{v}"),
        "metadata": o.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// The body for `items` (one object when `list` is false) in `form`; `meta` the list's
/// metadata (resource version, `continue`), `include_object` the query's `includeObject`.
pub(crate) fn render<T: std::borrow::Borrow<Value>>(
    rt: &ResourceType,
    form: Form,
    (items, list): (&[T], bool),
    meta: Value,
    include_object: Option<&str>,
) -> Result<Value, ApiError> {
    match form {
        Form::Metadata(v) if list => Ok(json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": format!("meta.k8s.io/{v}"),
            "metadata": meta,
            "items": items.iter().map(|o| partial(o.borrow(), v)).collect::<Vec<_>>(),
        })),
        Form::Metadata(v) => Ok(items
            .first()
            .map(|o| partial(o.borrow(), v))
            .unwrap_or_default()),
        Form::Table(v) => {
            let include = include(include_object)?;
            Ok(table(rt, v, items, meta, include))
        }
    }
}

fn table<T: std::borrow::Borrow<Value>>(
    rt: &ResourceType,
    v: &str,
    items: &[T],
    meta: Value,
    include: &str,
) -> Value {
    let now = chrono::Utc::now().timestamp();
    let mut columns = vec![json!({
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": "Name must be unique within a namespace (or the cluster, for a cluster-scoped kind).",
        "priority": 0,
    })];
    columns.extend(rt.printer_columns.iter().map(|c| {
        json!({
            "name": c.name,
            "type": c.kind,
            "format": c.format,
            "description": c.description,
            "priority": c.priority,
        })
    }));
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let o = o.borrow();
            let name = o.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
            let mut cells = vec![name];
            cells.extend(rt.printer_columns.iter().map(|c| printer::cell(c, o, now)));
            let mut row = json!({"cells": cells});
            match include {
                "Object" => row["object"] = o.clone(),
                "Metadata" => row["object"] = partial(o, v),
                _ => {}
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{v}"),
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::registry::Registry;

    const KUBECTL: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

    #[test]
    fn forms_as_clients_ask() {
        assert_eq!(wanted(KUBECTL), Some(Form::Table("v1")));
        assert_eq!(
            wanted("application/json;as=Table;v=v1beta1;g=meta.k8s.io"),
            Some(Form::Table("v1beta1"))
        );
        assert_eq!(
            wanted("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
            Some(Form::Metadata("v1"))
        );
        assert_eq!(wanted("application/json"), None);
        assert_eq!(wanted("application/json;as=Table;v=v2;g=meta.k8s.io"), None);
        assert_eq!(wanted("application/json;as=Table;v=v1;g=example.com"), None);
    }

    #[test]
    fn a_table_of_servers_with_the_crd_columns() {
        let rt = Registry::global().resolve("servers").unwrap();
        let o = json!({"metadata": {"name": "a", "creationTimestamp": "2020-01-01T00:00:00Z"},
                       "spec": {"systemUUID": "u-1"}, "status": {"manufacturer": "M"}});
        let t = render(
            &rt,
            Form::Table("v1"),
            (std::slice::from_ref(&o), true),
            json!({"resourceVersion": "7"}),
            None,
        )
        .unwrap();
        assert_eq!(
            (
                t["kind"].as_str(),
                t["metadata"]["resourceVersion"].as_str()
            ),
            (Some("Table"), Some("7"))
        );
        let names: Vec<&str> = (t["columnDefinitions"].as_array().unwrap().iter())
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(&names[..4], ["Name", "SystemUUID", "Manufacturer", "Model"]);
        assert!(
            names.contains(&"Age") && names.contains(&"Claim"),
            "{names:?}"
        );
        let row = &t["rows"][0];
        assert_eq!(
            (row["cells"][0].as_str(), row["cells"][1].as_str()),
            (Some("a"), Some("u-1"))
        );
        assert_eq!(row["cells"][3], Value::Null, "no model: <none>");
        let age = names.iter().position(|n| *n == "Age").unwrap();
        assert!(
            row["cells"][age].as_str().unwrap().contains('y'),
            "years old: {row}"
        );
        assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(row["object"]["metadata"]["name"], "a");
        let full = render(
            &rt,
            Form::Table("v1"),
            (std::slice::from_ref(&o), false),
            json!({}),
            Some("Object"),
        )
        .unwrap();
        assert_eq!(full["rows"][0]["object"], o);
        let none = render(
            &rt,
            Form::Table("v1"),
            (std::slice::from_ref(&o), false),
            json!({}),
            Some("None"),
        )
        .unwrap();
        assert!(none["rows"][0].get("object").is_none());
        let e = render(
            &rt,
            Form::Table("v1"),
            (&[o], false),
            json!({}),
            Some("All"),
        )
        .unwrap_err();
        assert_eq!(e.code, axum::http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn metadata_alone() {
        let rt = Registry::global().resolve("servers").unwrap();
        let o = json!({"metadata": {"name": "a"}, "spec": {"x": 1}});
        let l = render(
            &rt,
            Form::Metadata("v1"),
            (std::slice::from_ref(&o), true),
            json!({"resourceVersion": "3"}),
            None,
        )
        .unwrap();
        assert_eq!(l["kind"], "PartialObjectMetadataList");
        assert_eq!(
            l["items"][0],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a"}})
        );
        let one = render(&rt, Form::Metadata("v1"), (&[o], false), json!({}), None).unwrap();
        assert_eq!(one["metadata"]["name"], "a");
        assert!(one.get("spec").is_none());
    }
}
