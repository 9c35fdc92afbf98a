//! Procedural macros for mailring: `#[mailring::main]` (re-exported by
//! `mailring`), `#[derive(Actor)]` and `#[derive(Message)]` (re-exported by
//! `mailring-actors`).
//!
//! This crate depends on no other mailring crate; generated code names
//! `::mailring` and `::mailring_actors` paths.

mod actor;

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{parse_macro_input, DeriveInput, Expr, FnArg, ItemFn, Lit, Meta, Token};

/// Implements `mailring_actors::Actor` (and, unless `hooks` is given,
/// `mailring_actors::Hooks` with its defaults). See the `Actor` trait's docs
/// for the attributes of `#[actor(...)]`.
#[proc_macro_derive(Actor, attributes(actor))]
pub fn derive_actor(item: TokenStream) -> TokenStream {
    let input = parse_macro_input!(item as DeriveInput);
    match actor::expand_actor(input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Implements `mailring_actors::Message`; `#[message(reply = Type)]` sets the
/// reply type (default `()`).
#[proc_macro_derive(Message, attributes(message))]
pub fn derive_message(item: TokenStream) -> TokenStream {
    let input = parse_macro_input!(item as DeriveInput);
    match actor::expand_message(input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Implements `mailring::RouteKey` (re-exported by `mailring-actors`) for
/// a key type of your own: a struct routes as its fields in order (a
/// newtype as its one field, so `struct TenantId(u64)` shares its shards
/// with `u64`), an enum as its variant's index then its fields.
#[proc_macro_derive(RouteKey)]
pub fn derive_route_key(item: TokenStream) -> TokenStream {
    let input = parse_macro_input!(item as DeriveInput);
    actor::expand_route_key(input).into()
}

/// Runs an `async fn main` on a mailring runtime.
///
/// The function keeps its name (so tests may use the attribute on any
/// `async fn`) and becomes a plain `fn` that starts a runtime, runs the body on
/// shard 0 (it need not be `Send`), and shuts the runtime down.
///
/// Arguments (all optional): `shards = N`, `ring_entries = N`, `pin_threads = bool`.
/// `main` may take one argument, a `mailring::Handle`. When the runtime cannot
/// start, the error (cause and remedy) is printed and the process exits with
/// status 1.
///
/// The example is compiled and run with `mailring`'s crate documentation
/// (section "Entry point"), where the attribute is in reach.
#[proc_macro_attribute]
pub fn main(args: TokenStream, item: TokenStream) -> TokenStream {
    let input = parse_macro_input!(item as ItemFn);
    let parser = Punctuated::<Meta, Token![,]>::parse_terminated;
    let args = match parser.parse(args) {
        Ok(a) => a,
        Err(e) => return e.to_compile_error().into(),
    };
    match expand_main(args, input, Flavor::Runtime) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// `#[mailring_actors::main]` (re-exported by `mailring-actors` as `main`):
/// as `#[mailring::main]`, and an actor system on the same runtime, the
/// same set of threads. `main` may take one argument, the system's
/// `mailring_actors::SystemHandle`; the system is shut down (actors
/// stopped, then the runtime) when the body returns. Needs only the
/// `mailring-actors` dependency.
#[proc_macro_attribute]
pub fn actors_main(args: TokenStream, item: TokenStream) -> TokenStream {
    let input = parse_macro_input!(item as ItemFn);
    let parser = Punctuated::<Meta, Token![,]>::parse_terminated;
    let args = match parser.parse(args) {
        Ok(a) => a,
        Err(e) => return e.to_compile_error().into(),
    };
    match expand_main(args, input, Flavor::Actors) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Which entry point `expand_main` writes.
#[derive(Clone, Copy, PartialEq)]
enum Flavor {
    /// `#[mailring::main]`: a runtime; `main`'s argument is its `Handle`.
    Runtime,
    /// `#[mailring_actors::main]`: a runtime and an actor system on it;
    /// `main`'s argument is the system's `SystemHandle`.
    Actors,
}

fn expand_main(
    args: Punctuated<Meta, Token![,]>,
    input: ItemFn,
    flavor: Flavor,
) -> syn::Result<proc_macro2::TokenStream> {
    let attr = match flavor {
        Flavor::Runtime => "#[mailring::main]",
        Flavor::Actors => "#[mailring_actors::main]",
    };
    if input.sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(
            input.sig.fn_token,
            format!("{attr} needs an `async fn`"),
        ));
    }
    let mut settings = Vec::new();
    for arg in args {
        let Meta::NameValue(nv) = arg else {
            return Err(syn::Error::new_spanned(arg, "expected `name = value`"));
        };
        let name = nv
            .path
            .get_ident()
            .map(ToString::to_string)
            .ok_or_else(|| syn::Error::new_spanned(&nv.path, "expected an identifier"))?;
        let value = match &nv.value {
            Expr::Lit(l) => match &l.lit {
                Lit::Int(_) | Lit::Bool(_) => l.clone(),
                other => {
                    return Err(syn::Error::new_spanned(
                        other,
                        "expected an integer or a bool",
                    ))
                }
            },
            other => return Err(syn::Error::new_spanned(other, "expected a literal")),
        };
        let setting = match name.as_str() {
            "shards" => quote!(.shards(#value)),
            "ring_entries" => quote!(.ring_entries(#value)),
            "pin_threads" => quote!(.pin_threads(#value)),
            _ => {
                return Err(syn::Error::new_spanned(
                    &nv.path,
                    "unknown setting: expected `shards`, `ring_entries` or `pin_threads`",
                ))
            }
        };
        settings.push(setting);
    }
    let attrs = &input.attrs;
    let vis = &input.vis;
    let body = &input.block;
    let output = &input.sig.output;
    let name = &input.sig.ident;
    let inputs: Vec<_> = input.sig.inputs.iter().collect();
    let bind_handle = match inputs.as_slice() {
        [] => quote!(),
        [FnArg::Typed(pat)] => {
            let pat = &pat.pat;
            quote!(let #pat = __mailring_handle;)
        }
        _ => {
            let what = match flavor {
                Flavor::Runtime => "one `mailring::Handle`",
                Flavor::Actors => "one `mailring_actors::SystemHandle`",
            };
            return Err(syn::Error::new_spanned(
                &input.sig.inputs,
                format!("{attr} takes no argument or {what}"),
            ));
        }
    };
    if flavor == Flavor::Actors {
        return Ok(quote! {
            #(#attrs)*
            #vis fn #name() #output {
                let __mailring_builder =
                    ::mailring_actors::mailring::Runtime::builder() #(#settings)*;
                let __mailring_system = match ::mailring_actors::ActorSystem::start(__mailring_builder) {
                    ::core::result::Result::Ok(system) => system,
                    ::core::result::Result::Err(e) => {
                        ::std::eprintln!("error: cannot start the mailring runtime: {}", e);
                        ::std::process::exit(1);
                    }
                };
                let __mailring_handle = __mailring_system.handle();
                let __mailring_out = __mailring_system.block_on_local(move || async move {
                    #bind_handle
                    #body
                });
                __mailring_system.shutdown();
                __mailring_out
            }
        });
    }
    Ok(quote! {
        #(#attrs)*
        #vis fn #name() #output {
            let __mailring_rt = match ::mailring::Runtime::builder() #(#settings)* .build() {
                ::core::result::Result::Ok(rt) => rt,
                ::core::result::Result::Err(e) => {
                    ::std::eprintln!("error: cannot start the mailring runtime: {}", e);
                    ::std::process::exit(1);
                }
            };
            let __mailring_handle = __mailring_rt.handle().clone();
            let __mailring_out = __mailring_rt.block_on_local(move || async move {
                #bind_handle
                #body
            });
            __mailring_rt.shutdown();
            __mailring_out
        }
    })
}
