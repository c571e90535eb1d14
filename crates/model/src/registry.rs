//! The registry of resource types the API serves: each type's group, version, kind,
//! plural, scope, schema and printer columns. CRD-defined kinds are loaded from the
//! CRD YAML embedded in the binary (`crates/model/src/crds/`), so validation follows the CRDs
//! exactly; core kinds (`v1 Secret`, `v1 Event`) and bootplane's own schema-less kinds
//! (`auth.bootplane.dev/v1alpha1 APIToken`, the API's named tokens) are declared here.

use std::sync::{Arc, OnceLock};

use serde::Deserialize;

use super::schema::Schema;

#[derive(Debug)]
pub struct ResourceType {
    /// API group; empty for the core group (`v1`).
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    /// Whole-object schema (apiVersion, kind, metadata, spec, status).
    pub schema: Option<Schema>,
    pub status_subresource: bool,
    /// Every printer column with its type and priority, as a server-side `Table`
    /// declares them after `Name` (the CRD's own, `Age` included, then ours).
    pub printer_columns: Vec<PrinterColumn>,
    /// The CRD's `names.categories` (`kubectl get all` style groupings).
    pub categories: Vec<String>,
    /// The CustomResourceDefinition this type comes from, as embedded.
    pub crd: Option<&'static str>,
}

/// One column of `kubectl get`, as a CRD's `additionalPrinterColumns` declares it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrinterColumn {
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub format: String,
    #[serde(default)]
    pub description: String,
    /// 0: always shown; more: only with `-o wide`.
    #[serde(default)]
    pub priority: i32,
    pub json_path: String,
}

impl PrinterColumn {
    fn new(name: &str, kind: &str, json_path: &str, priority: i32) -> PrinterColumn {
        PrinterColumn {
            name: name.into(),
            kind: kind.into(),
            format: String::new(),
            description: String::new(),
            priority,
            json_path: json_path.into(),
        }
    }

    /// The `Age` column kube adds to a CRD that declares none.
    fn age() -> PrinterColumn {
        PrinterColumn::new("Age", "date", ".metadata.creationTimestamp", 0)
    }
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn group_key(&self) -> &str {
        if self.group.is_empty() {
            "core"
        } else {
            &self.group
        }
    }

    /// `(HEADER, jsonPath)` of the columns the CLI's tables show between NAME and AGE
    /// (which it prints itself): the priority-0 printer columns but `Age`, then, with
    /// `wide`, the others.
    pub fn cli_columns(&self, wide: bool) -> Vec<(String, &str)> {
        fn col(c: &PrinterColumn) -> (String, &str) {
            (c.name.to_uppercase(), c.json_path.as_str())
        }
        let normal = (self.printer_columns.iter()).filter(|c| c.priority == 0 && c.name != "Age");
        let more = (self.printer_columns.iter()).filter(|c| wide && c.priority > 0);
        normal.chain(more).map(col).collect()
    }

    /// Store key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => format!("/{}/{}/{}/{}", self.group_key(), self.plural, ns, name),
            _ => format!("/{}/{}/{}", self.group_key(), self.plural, name),
        }
    }

    /// Store key prefix of all objects of this type (in one namespace if given).
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => format!("/{}/{}/{}/", self.group_key(), self.plural, ns),
            _ => format!("/{}/{}/", self.group_key(), self.plural),
        }
    }

    /// `plural.group` as kubectl prints it (`servers.metal.ironcore.dev`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Crd {
    spec: CrdSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CrdSpec {
    group: String,
    names: CrdNames,
    scope: String,
    versions: Vec<CrdVersion>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CrdNames {
    kind: String,
    plural: String,
    singular: Option<String>,
    #[serde(default)]
    short_names: Vec<String>,
    #[serde(default)]
    categories: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CrdVersion {
    name: String,
    #[serde(default)]
    storage: bool,
    schema: Option<CrdSchema>,
    #[serde(default)]
    subresources: Option<serde_json::Value>,
    #[serde(default)]
    additional_printer_columns: Vec<PrinterColumn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CrdSchema {
    #[serde(rename = "openAPIV3Schema")]
    open_api_v3_schema: Schema,
}

/// Parse one CRD document into a resource type (storage version).
pub(crate) fn from_crd(yaml: &str) -> Result<ResourceType, String> {
    let crd: Crd = serde_norway::from_str(yaml).map_err(|e| format!("parsing crd: {e}"))?;
    let v = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .or(crd.spec.versions.first())
        .ok_or_else(|| format!("crd {} has no versions", crd.spec.names.plural))?;
    let mut schema = v.schema.as_ref().map(|s| s.open_api_v3_schema.clone());
    if let Some(s) = &mut schema {
        s.prepare()?;
    }
    let mut printer_columns = v.additional_printer_columns.clone();
    if printer_columns.is_empty() {
        printer_columns.push(PrinterColumn::age());
    }
    Ok(ResourceType {
        group: crd.spec.group,
        version: v.name.clone(),
        kind: crd.spec.names.kind.clone(),
        singular: crd
            .spec
            .names
            .singular
            .clone()
            .unwrap_or_else(|| crd.spec.names.kind.to_lowercase()),
        plural: crd.spec.names.plural,
        short_names: crd.spec.names.short_names,
        namespaced: crd.spec.scope == "Namespaced",
        status_subresource: v
            .subresources
            .as_ref()
            .and_then(|s| s.get("status"))
            .is_some(),
        schema,
        printer_columns,
        categories: crd.spec.names.categories,
        crd: None,
    })
}

pub struct Registry {
    pub types: Vec<Arc<ResourceType>>,
}

const CRDS: &[&str] = &[
    include_str!("crds/metal.ironcore.dev_servers.yaml"),
    include_str!("crds/metal.ironcore.dev_serverclaims.yaml"),
    include_str!("crds/metal.ironcore.dev_serverbootconfigurations.yaml"),
    include_str!("crds/metal.ironcore.dev_bmcs.yaml"),
    include_str!("crds/metal.ironcore.dev_bmcsecrets.yaml"),
    include_str!("crds/metal.ironcore.dev_endpoints.yaml"),
    include_str!("crds/provisioning.bootplane.dev_images.yaml"),
    include_str!("crds/provisioning.bootplane.dev_zonalimages.yaml"),
    include_str!("crds/provisioning.bootplane.dev_storagevolumes.yaml"),
    include_str!("crds/provisioning.bootplane.dev_exportpolicies.yaml"),
    include_str!("crds/provisioning.bootplane.dev_exportpolicyrules.yaml"),
    include_str!("crds/provisioning.bootplane.dev_baremetalspecs.yaml"),
    include_str!("crds/provisioning.bootplane.dev_baremetalservers.yaml"),
    include_str!("crds/provisioning.bootplane.dev_serveractions.yaml"),
];

/// Every embedded CRD as one YAML stream, each document starting with `---`, in the
/// registry's order (`bootplane crds`).
pub fn crds_yaml() -> String {
    let mut out = String::new();
    for c in CRDS {
        let c = c.trim_start();
        if !c.starts_with("---") {
            out.push_str("---\n");
        }
        out.push_str(c);
        if !c.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

impl Registry {
    /// The built-in registry (parsed once).
    pub fn global() -> &'static Registry {
        static R: OnceLock<Registry> = OnceLock::new();
        R.get_or_init(|| Registry::build().expect("embedded CRDs are valid"))
    }

    fn build() -> Result<Registry, String> {
        let mut types = vec![Arc::new(ResourceType {
            group: String::new(),
            version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
            singular: "secret".into(),
            short_names: vec![],
            namespaced: true,
            schema: None,
            status_subresource: false,
            printer_columns: vec![
                PrinterColumn::new("Type", "string", ".type", 0),
                PrinterColumn::age(),
            ],
            categories: vec![],
            crd: None,
        })];
        // What happened to an object and why (`store::events`); checked by
        // `store::validate`.
        types.push(Arc::new(ResourceType {
            group: String::new(),
            version: "v1".into(),
            kind: "Event".into(),
            plural: "events".into(),
            singular: "event".into(),
            short_names: vec!["ev".into()],
            namespaced: true,
            schema: None,
            status_subresource: false,
            printer_columns: vec![
                PrinterColumn::new("Last Seen", "date", ".lastTimestamp", 0),
                PrinterColumn::new("Type", "string", ".type", 0),
                PrinterColumn::new("Reason", "string", ".reason", 0),
                PrinterColumn::new("Kind", "string", ".involvedObject.kind", 0),
                PrinterColumn::new("Object", "string", ".involvedObject.name", 0),
                PrinterColumn::new("Count", "integer", ".count", 0),
                PrinterColumn::new("Message", "string", ".message", 0),
                PrinterColumn::new("Source", "string", ".source.component", 1),
            ],
            categories: vec![],
            crd: None,
        }));
        // A named API token: its role, expiry and the SHA-256 of its secret
        // (`api::auth`); checked by `store::validate`.
        types.push(Arc::new(ResourceType {
            group: "auth.bootplane.dev".into(),
            version: "v1alpha1".into(),
            kind: "APIToken".into(),
            plural: "apitokens".into(),
            singular: "apitoken".into(),
            short_names: vec![],
            namespaced: false,
            schema: None,
            status_subresource: false,
            printer_columns: vec![
                PrinterColumn::new("Role", "string", ".spec.role", 0),
                PrinterColumn::new("Expires", "string", ".spec.expiresAt", 0),
                PrinterColumn::age(),
            ],
            categories: vec![],
            crd: None,
        }));
        for c in CRDS {
            let mut t = from_crd(c)?;
            t.crd = Some(c);
            // bootplane's own wide columns, after the CRD's.
            let ours: &[(&str, &str, &str)] = match t.kind.as_str() {
                "ServerBootConfiguration" => &[
                    (
                        "Script",
                        "date",
                        ".status.conditions[?(@.type==\"IPXEScriptFetched\")].lastTransitionTime",
                    ),
                    (
                        "Ignition",
                        "date",
                        ".status.conditions[?(@.type==\"IgnitionDataFetched\")].lastTransitionTime",
                    ),
                ],
                "Server" => &[("Claim", "string", ".spec.serverClaimRef.name")],
                _ => &[],
            };
            for (name, kind, path) in ours {
                t.printer_columns
                    .push(PrinterColumn::new(name, kind, path, 1));
            }
            types.push(Arc::new(t));
        }
        Ok(Registry { types })
    }

    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.kind == kind && t.api_version() == api_version)
            .cloned()
    }

    pub fn by_plural(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
    }

    /// Resolve a name as the CLI accepts it: plural, singular, kind, short name, or
    /// `plural.group` — case-insensitive.
    pub fn resolve(&self, name: &str) -> Option<Arc<ResourceType>> {
        let n = name.to_ascii_lowercase();
        self.types
            .iter()
            .find(|t| {
                t.plural == n
                    || t.singular == n
                    || t.kind.to_ascii_lowercase() == n
                    || t.short_names.contains(&n)
                    || t.qualified() == n
                    || format!("{}.{}", t.singular, t.group) == n
            })
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_types() {
        let r = Registry::global();
        let s = r.resolve("srv").unwrap();
        assert_eq!(
            (s.kind.as_str(), s.namespaced, s.status_subresource),
            ("Server", false, true)
        );
        assert_eq!(s.key(None, "a"), "/metal.ironcore.dev/servers/a");
        let c = r.resolve("ServerClaim").unwrap();
        assert!(c.namespaced);
        assert_eq!(
            c.key(Some("default"), "x"),
            "/metal.ironcore.dev/serverclaims/default/x"
        );
        assert_eq!(r.resolve("secrets").unwrap().api_version(), "v1");
        assert!(r.resolve("sbc").is_some());
        assert!(r.resolve("nope").is_none());
        let mut unsupported = Vec::new();
        for t in &r.types {
            if let Some(s) = &t.schema {
                s.unsupported_rules(&t.kind, &mut unsupported);
            }
        }
        assert!(unsupported.is_empty(), "{unsupported:?}");
    }
}
