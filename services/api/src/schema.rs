//! JSON Schemas of the contract's types for an OpenAPI 3.1 document: each named type once in
//! `components/schemas`, referred to with `$ref: "#/components/schemas/<Name>"`.
//!
//! Requests are described as serde deserialises them (a field with a default is optional),
//! responses as serde serialises them (a field that is always written is required, `null`
//! included), each with its own generator; a name both use must mean the same schema (checked
//! by [`Components::finish`]).
use schemars::JsonSchema;
use schemars::generate::{Contract, SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value};

/// Where the named schemas go, as a JSON pointer.
pub const DEFINITIONS_PATH: &str = "/components/schemas";

/// A function that describes one type through a [`Components`] collector.
pub type Describe = fn(&mut Components) -> Value;

/// The schema (usually a `$ref`) of request body type `T`, registering its definitions.
pub fn request<T: JsonSchema>(c: &mut Components) -> Value {
    c.requests.subschema_for::<T>().to_value()
}

/// The schema (usually a `$ref`) of response body type `T`, registering its definitions.
pub fn response<T: JsonSchema>(c: &mut Components) -> Value {
    c.responses.subschema_for::<T>().to_value()
}

/// Collects the named schemas of every type described through it.
pub struct Components {
    requests: SchemaGenerator,
    responses: SchemaGenerator,
}

impl Default for Components {
    fn default() -> Self {
        Self::new()
    }
}

fn settings(contract: Contract) -> SchemaSettings {
    let mut s = SchemaSettings::draft2020_12();
    s.definitions_path = DEFINITIONS_PATH.into();
    s.meta_schema = None;
    s.contract = contract;
    s
}

impl Components {
    pub fn new() -> Self {
        Self {
            requests: settings(Contract::Deserialize).into_generator(),
            responses: settings(Contract::Serialize).into_generator(),
        }
    }

    /// Every named schema described so far, by name.
    ///
    /// # Panics
    /// When a request and a response type take the same name with different schemas: rename
    /// one (`#[schemars(rename = "…")]`).
    pub fn finish(mut self) -> Map<String, Value> {
        let mut out = self.responses.take_definitions(true);
        for (name, schema) in self.requests.take_definitions(true) {
            match out.get(&name) {
                Some(have) if *have != schema => {
                    panic!("schema {name} differs as a request and as a response: name them apart")
                }
                _ => {
                    out.insert(name, schema);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pages_and_types_are_referenced_from_components() {
        let mut c = Components::new();
        let page = response::<crate::Page<crate::credentials::Credential>>(&mut c);
        assert_eq!(page["properties"]["items"]["items"], json!({"$ref": "#/components/schemas/Credential"}));
        assert_eq!(page["required"], json!(["items", "next_cursor"]));
        let body = request::<crate::credentials::CredentialPut>(&mut c);
        assert_eq!(body, json!({"$ref": "#/components/schemas/CredentialPut"}));
        let defs = c.finish();
        assert_eq!(defs["CredentialPut"]["additionalProperties"], false);
        assert_eq!(defs["Credential"]["required"], json!(["name", "version", "created_at", "updated_at"]));
    }
}
