//! What every operation of a group of routes shares in the OpenAPI document, declared here once
//! instead of in each `#[utoipa::path]`: who may call it (the bearer token of the `/v1` routes
//! behind `auth::authenticate`, what an agent route declares, nothing for the process endpoints), the Problem answer of every failure,
//! and the `Idempotency-Key` every authenticated `POST` accepts (`idempotency::idempotency`).

use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::SchemaType;
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{ContentBuilder, ObjectBuilder, OpenApi, Ref, Required, ResponseBuilder, Type};

/// How a group of routes is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Behind the bearer-token middleware; failures are Problems; `POST` takes `Idempotency-Key`.
    Bearer,
    /// The agents': each route declares its own credential (the seed token in the path, or the
    /// run's agent token as a bearer: the `agent_token` scheme); failures are Problems.
    Agent,
    /// Without any credential (process endpoints); they answer no Problem.
    Open,
}

/// Applies what `access` means to every operation of `openapi`.
pub fn document(openapi: &mut OpenApi, access: Access) {
    for item in openapi.paths.paths.values_mut() {
        if let Some(op) = &mut item.post {
            apply(op, access, true);
        }
        for op in [&mut item.get, &mut item.put, &mut item.delete, &mut item.patch].into_iter().flatten() {
            apply(op, access, false);
        }
    }
}

fn apply(op: &mut Operation, access: Access, post: bool) {
    match access {
        Access::Bearer => op.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]),
        Access::Agent => {
            op.security.get_or_insert_with(|| vec![SecurityRequirement::default()]);
        }
        Access::Open => op.security = Some(vec![SecurityRequirement::default()]),
    }
    if access != Access::Open {
        // An operation may describe its own failures more precisely (the agents' do).
        op.responses.responses.entry("default".to_owned()).or_insert_with(|| problem().into());
    }
    if access == Access::Bearer && post {
        op.parameters.get_or_insert_with(Vec::new).push(idempotency_key());
    }
}

/// The answer of every failure: `application/problem+json`.
fn problem() -> utoipa::openapi::Response {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build();
    ResponseBuilder::new().description("Problem").content("application/problem+json", content).build()
}

fn idempotency_key() -> Parameter {
    let optional_string = ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Null]));
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .description(Some("Replays the first answer for 24 h"))
        .required(Required::False)
        .schema(Some(optional_string))
        .build()
}
