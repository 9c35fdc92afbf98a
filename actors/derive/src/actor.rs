//! `#[derive(Actor)]` and `#[derive(Message)]`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::punctuated::Punctuated;
use syn::{DeriveInput, Expr, ExprLit, Lit, LitInt, LitStr, Path, Token, Type};

#[derive(Default)]
struct ActorArgs {
    key: Option<Type>,
    activate: Option<Expr>,
    placement: Option<TokenStream>,
    /// `placement = path::to::fn`: the type's own key -> shard function.
    place_fn: Option<Expr>,
    mailbox: Option<LitInt>,
    idle_timeout_ms: Option<LitInt>,
    max_active: Option<LitInt>,
    supervision: Option<TokenStream>,
    max_restarts: Option<LitInt>,
    restart_window_ms: Option<LitInt>,
    handles: Option<Vec<Type>>,
    hooks: bool,
}

fn int(e: &Expr, what: &str) -> syn::Result<LitInt> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => Ok(i.clone()),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{what}` expects an integer literal"),
        )),
    }
}

fn string(e: &Expr, what: &str) -> syn::Result<LitStr> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.clone()),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{what}` expects a string literal"),
        )),
    }
}

/// One item of `#[actor(...)]` / `#[message(...)]`: `name`, `name = value`
/// (a type for `key`/`reply`, an expression otherwise) or `name(T, ...)`.
enum Item {
    Flag(Path),
    Value(Path, Expr),
    Type(Path, Type),
    List(Path, Vec<Type>),
}

impl Item {
    fn path(&self) -> &Path {
        match self {
            Item::Flag(p) | Item::Value(p, _) | Item::Type(p, _) | Item::List(p, _) => p,
        }
    }
}

fn parse_items(attr: &syn::Attribute, type_valued: &[&str]) -> syn::Result<Vec<Item>> {
    attr.parse_args_with(|input: syn::parse::ParseStream<'_>| {
        let mut items = Vec::new();
        while !input.is_empty() {
            let path: Path = input.parse()?;
            if input.peek(Token![=]) {
                input.parse::<Token![=]>()?;
                let is_type = path
                    .get_ident()
                    .is_some_and(|i| type_valued.iter().any(|t| i == t));
                if is_type {
                    items.push(Item::Type(path, input.parse()?));
                } else {
                    items.push(Item::Value(path, input.parse()?));
                }
            } else if input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in input);
                let types = Punctuated::<Type, Token![,]>::parse_terminated(&content)?;
                items.push(Item::List(path, types.into_iter().collect()));
            } else {
                items.push(Item::Flag(path));
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(items)
    })
}

fn parse_actor_args(input: &DeriveInput) -> syn::Result<ActorArgs> {
    let mut args = ActorArgs::default();
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("actor")) {
        for item in parse_items(attr, &["key"])? {
            let name = item
                .path()
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            match (name.as_str(), &item) {
                ("hooks", Item::Flag(_)) => args.hooks = true,
                ("handles", Item::List(_, types)) => args.handles = Some(types.clone()),
                ("key", Item::Type(_, ty)) => args.key = Some(ty.clone()),
                ("activate", Item::Value(_, v)) => args.activate = Some(v.clone()),
                ("placement", Item::Value(_, v @ Expr::Path(_))) => {
                    args.placement = Some(quote!(::mailring_actors::ActorPlacement::Custom));
                    args.place_fn = Some(v.clone());
                }
                ("placement", Item::Value(_, v)) => {
                    let s = string(v, "placement")?;
                    args.placement = Some(match s.value().as_str() {
                        "sticky" => quote!(::mailring_actors::ActorPlacement::Sticky),
                        "stealable" => quote!(::mailring_actors::ActorPlacement::Stealable),
                        "balanced" => quote!(::mailring_actors::ActorPlacement::Balanced),
                        "first_sender" => quote!(::mailring_actors::ActorPlacement::FirstSender),
                        _ => {
                            return Err(syn::Error::new_spanned(
                                s,
                                "unknown placement: expected \"sticky\", \"stealable\", \"balanced\", \"first_sender\", a function path \
                                 (`placement = my_placement`, a `fn(&Key, usize) -> ShardId`) or `pinned = N`",
                            ))
                        }
                    });
                }
                ("pinned", Item::Value(_, v)) => {
                    let n = int(v, "pinned")?;
                    args.placement = Some(quote!(::mailring_actors::ActorPlacement::Pinned(
                        ::mailring_actors::ShardId::new(#n),
                    )));
                }
                ("mailbox", Item::Value(_, v)) => args.mailbox = Some(int(v, "mailbox")?),
                ("idle_timeout_ms", Item::Value(_, v)) => {
                    args.idle_timeout_ms = Some(int(v, "idle_timeout_ms")?)
                }
                ("max_active", Item::Value(_, v)) => args.max_active = Some(int(v, "max_active")?),
                ("max_restarts", Item::Value(_, v)) => {
                    args.max_restarts = Some(int(v, "max_restarts")?)
                }
                ("restart_window_ms", Item::Value(_, v)) => {
                    args.restart_window_ms = Some(int(v, "restart_window_ms")?)
                }
                ("supervision", Item::Value(_, v)) => {
                    let s = string(v, "supervision")?;
                    args.supervision = Some(match s.value().as_str() {
                        "restart" => quote!(::mailring_actors::SupervisionPolicy::Restart),
                        "stop" => quote!(::mailring_actors::SupervisionPolicy::Stop),
                        "escalate" => quote!(::mailring_actors::SupervisionPolicy::Escalate),
                        _ => return Err(syn::Error::new_spanned(
                            s,
                            "unknown supervision: expected \"restart\", \"stop\" or \"escalate\"",
                        )),
                    });
                }
                _ => return Err(unknown(item.path())),
            }
        }
    }
    Ok(args)
}

fn unknown(p: &Path) -> syn::Error {
    syn::Error::new_spanned(
        p,
        "unknown actor attribute: expected one of `key`, `activate`, `placement`, `pinned`, `mailbox`, \
         `idle_timeout_ms`, `max_active`, `supervision`, `max_restarts`, `restart_window_ms`, `handles(...)`, `hooks`",
    )
}

pub(crate) fn expand_actor(input: DeriveInput) -> syn::Result<TokenStream> {
    if let Some(p) = input
        .generics
        .params
        .iter()
        .find(|p| !matches!(p, syn::GenericParam::Type(_)))
    {
        return Err(syn::Error::new_spanned(
            p,
            "#[derive(Actor)] takes type parameters only: an actor lives as long as its shard \
             (no lifetime parameters), and const parameters are not supported",
        ));
    }
    let args = parse_actor_args(&input)?;
    let generic = !input.generics.params.is_empty();
    // An actor is `'static` (it outlives every message): so is each of its
    // type parameters.
    let mut generics = input.generics.clone();
    for p in generics.type_params_mut() {
        p.bounds.push(syn::parse_quote!('static));
    }
    let (impl_g, ty_g, where_g) = generics.split_for_impl();
    let bare = &input.ident;
    let name_ts = quote!(#bare #ty_g);
    let name = &name_ts;
    let vis = &input.vis;
    let key = args.key.clone().map_or_else(|| quote!(()), |k| quote!(#k));
    if args.key.is_none() && args.activate.is_some() {
        return Err(syn::Error::new_spanned(
            args.activate.as_ref(),
            "`activate` builds keyed actors: add `key = Type`",
        ));
    }
    let placement = args
        .placement
        .clone()
        .unwrap_or_else(|| quote!(::mailring_actors::ActorPlacement::Sticky));
    let opt_int = |v: &Option<LitInt>| match v {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };
    let mailbox = opt_int(&args.mailbox);
    let max_active = opt_int(&args.max_active);
    let idle = match &args.idle_timeout_ms {
        Some(n) => quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#n))),
        None => quote!(::core::option::Option::None),
    };
    let policy = args
        .supervision
        .clone()
        .unwrap_or_else(|| quote!(::mailring_actors::Supervision::DEFAULT.policy));
    let max_restarts = args.max_restarts.as_ref().map_or_else(
        || quote!(::mailring_actors::Supervision::DEFAULT.max_restarts),
        |n| quote!(#n),
    );
    let within = args.restart_window_ms.as_ref().map_or_else(
        || quote!(::mailring_actors::Supervision::DEFAULT.within),
        |n| quote!(::core::time::Duration::from_millis(#n)),
    );
    let activate = match &args.activate {
        Some(path) => quote! {
            const HAS_ACTIVATE: bool = true;
            fn activate(key: &Self::Key) -> ::core::option::Option<Self> {
                ::core::option::Option::Some((#path)(key))
            }
        },
        None => quote!(),
    };
    let place = match &args.place_fn {
        Some(f) => {
            if args.key.is_none() {
                return Err(syn::Error::new_spanned(
                    f,
                    "a placement function places keyed actors: add `key = Type`",
                ));
            }
            quote! {
                fn place(key: &Self::Key, shards: usize) -> ::mailring_actors::ShardId {
                    (#f)(key, shards)
                }
            }
        }
        None => quote!(),
    };
    // Hooks are picked at compile time: the type's `Hooks` impl if it has
    // one, nothing otherwise (`hooks` is accepted and changes nothing), so
    // writing `impl Hooks` never conflicts with the derive.
    let _ = args.hooks;
    let hooks = quote! {
        fn __on_start<'__a>(
            &'__a mut self,
            cx: &'__a mut ::mailring_actors::Ctx<Self>,
        ) -> impl ::core::future::Future<Output = ()> + '__a {
            #[allow(unused_imports)]
            use ::mailring_actors::__private::{ViaDefault as _, ViaHooks as _};
            ::mailring_actors::__private::HooksOf::<Self>::new().on_start(self, cx)
        }
        fn __on_passivate<'__a>(
            &'__a mut self,
            cx: &'__a mut ::mailring_actors::Ctx<Self>,
        ) -> impl ::core::future::Future<Output = ()> + '__a {
            #[allow(unused_imports)]
            use ::mailring_actors::__private::{ViaDefault as _, ViaHooks as _};
            ::mailring_actors::__private::HooksOf::<Self>::new().on_passivate(self, cx)
        }
        fn __on_stop<'__a>(
            &'__a mut self,
            cx: &'__a mut ::mailring_actors::Ctx<Self>,
        ) -> impl ::core::future::Future<Output = ()> + '__a {
            #[allow(unused_imports)]
            use ::mailring_actors::__private::{ViaDefault as _, ViaHooks as _};
            ::mailring_actors::__private::HooksOf::<Self>::new().on_stop(self, cx)
        }
    };
    let (envelope_ty, envelope_items, continuation) = match &args.handles {
        Some(types) => {
            let env_ident = format_ident!("__MailringEnvelope{}", bare);
            let env = quote!(#env_ident #ty_g);
            let env_decl = quote!(#env_ident #impl_g);
            let tells: Vec<_> = (0..types.len()).map(|i| format_ident!("T{}", i)).collect();
            let asks: Vec<_> = (0..types.len()).map(|i| format_ident!("A{}", i)).collect();
            let doc =
                format!("The mailbox envelope of [`{bare}`], generated by `#[derive(Actor)]`.");
            let items = quote! {
                #[doc = #doc]
                #[doc(hidden)]
                #[allow(non_camel_case_types, missing_docs, clippy::type_complexity)]
                #vis enum #env_decl #where_g {
                    // A tell carries just the message; an ask also its reply slot.
                    #( #tells(#types), )*
                    #( #asks(::mailring_actors::Asked<#types>), )*
                    /// Work resumed after `Ctx::wait_for`.
                    __Continue(::mailring_actors::__private::Continuation<#name>),
                }

                impl #impl_g ::core::fmt::Debug for #env #where_g {
                    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                        f.write_str(::core::stringify!(#env_ident))
                    }
                }

                impl #impl_g ::mailring_actors::Envelope<#name> for #env #where_g {
                    async fn handle(self, actor: &mut #name, cx: &mut ::mailring_actors::Ctx<#name>) {
                        match self {
                            #( #env_ident::#tells(m) => {
                                // Called through the trait path (no `#name` token):
                                // a missing `Handler` impl is then one error, at the
                                // derive, shared with the ask arm's.
                                let _ = ::mailring_actors::Handler::<#types>::handle(actor, m, cx).await;
                            } )*
                            #( #env_ident::#asks(asked) => {
                                ::mailring_actors::__private::handle_asked::<_, #types>(actor, asked, cx).await
                            } )*
                            #env_ident::__Continue(c) => c.run(actor, cx),
                        }
                    }

                    fn __ask_probe(&self) -> ::core::option::Option<::mailring_actors::__private::AskProbe<'_>> {
                        match self {
                            #( #env_ident::#asks(asked) => ::core::option::Option::Some(asked.__probe()), )*
                            _ => ::core::option::Option::None,
                        }
                    }
                }

                // Never used: with a second `Accepts` impl, a message missing
                // from a one-entry `handles(..)` gets the "does not accept"
                // error instead of an inferred "expected `Ping`".
                impl #impl_g ::mailring_actors::Accepts<::mailring_actors::__private::Unlisted> for #name #where_g {
                    fn envelope(never: ::mailring_actors::__private::Unlisted) -> #env {
                        match never {}
                    }

                    fn ask_envelope(
                        asked: ::mailring_actors::Asked<::mailring_actors::__private::Unlisted>,
                    ) -> #env {
                        ::mailring_actors::__private::unlisted_ask(asked)
                    }
                }

                #(
                    impl #impl_g ::mailring_actors::Accepts<#types> for #name #where_g {
                        #[inline]
                        fn envelope(msg: #types) -> #env {
                            #env_ident::#tells(msg)
                        }

                        #[inline]
                        fn ask_envelope(asked: ::mailring_actors::Asked<#types>) -> #env {
                            #env_ident::#asks(asked)
                        }
                    }
                )*
            };
            let cont = quote! {
                fn __continuation(c: ::mailring_actors::__private::Continuation<Self>) -> #env {
                    #env_ident::__Continue(c)
                }
            };
            (quote!(#env), items, cont)
        }
        None => (
            quote!(::mailring_actors::__private::DynEnvelope<Self>),
            {
                let mut with_m = generics.clone();
                with_m.params.push(syn::parse_quote!(M));
                let (impl_m, _, _) = with_m.split_for_impl();
                let preds = generics.where_clause.as_ref().map(|w| &w.predicates);
                quote! {
                impl #impl_m ::mailring_actors::Accepts<M> for #name
                where
                    // Stated: with the `Handler` bound in scope, a generic
                    // type's envelope would not normalize otherwise.
                    #name: ::mailring_actors::Actor<Envelope = ::mailring_actors::__private::DynEnvelope<#name>>,
                    #name: ::mailring_actors::Handler<M>,
                    M: ::mailring_actors::Message + ::core::marker::Send,
                    M::Reply: ::core::marker::Send,
                    #preds
                {
                    fn envelope(msg: M) -> ::mailring_actors::__private::DynEnvelope<Self> {
                        ::mailring_actors::__private::DynEnvelope::told(msg)
                    }

                    fn ask_envelope(asked: ::mailring_actors::Asked<M>) -> ::mailring_actors::__private::DynEnvelope<Self> {
                        ::mailring_actors::__private::DynEnvelope::asked(asked)
                    }
                }
                }
            },
            quote! {
                fn __continuation(
                    c: ::mailring_actors::__private::Continuation<Self>,
                ) -> ::mailring_actors::__private::DynEnvelope<Self> {
                    ::mailring_actors::__private::DynEnvelope::continuation(c)
                }
            },
        ),
    };

    // A static in a generic function is one for all its instances: a
    // generic type finds its slot and cache by `TypeId` instead.
    let statics = if generic {
        quote! {
            fn __slot() -> &'static ::mailring_actors::__private::TypeSlot {
                ::mailring_actors::__private::generic_slot::<Self>()
            }
            #[inline(always)]
            fn __with_local_cache<R>(
                f: impl ::core::ops::FnOnce(&::mailring_actors::__private::LocalCache<Self>) -> R,
            ) -> ::core::option::Option<R> {
                ::mailring_actors::__private::with_generic_cache::<Self, R>(f)
            }
        }
    } else {
        quote! {
            fn __slot() -> &'static ::mailring_actors::__private::TypeSlot {
                static SLOT: ::mailring_actors::__private::TypeSlot = ::mailring_actors::__private::TypeSlot::new();
                &SLOT
            }
            fn __with_local_cache<R>(
                f: impl ::core::ops::FnOnce(&::mailring_actors::__private::LocalCache<Self>) -> R,
            ) -> ::core::option::Option<R> {
                ::std::thread_local! {
                    static CACHE: ::mailring_actors::__private::LocalCache<#name> =
                        const { ::mailring_actors::__private::LocalCache::new() };
                }
                CACHE.try_with(f).ok()
            }
        }
    };
    Ok(quote! {
        impl #impl_g ::mailring_actors::Actor for #name #where_g {
            type Key = #key;
            type Envelope = #envelope_ty;
            #statics
            const CONFIG: ::mailring_actors::ActorConfig = ::mailring_actors::ActorConfig {
                placement: #placement,
                mailbox: #mailbox,
                idle_timeout: #idle,
                max_active_per_shard: #max_active,
                supervision: ::mailring_actors::Supervision {
                    policy: #policy,
                    max_restarts: #max_restarts,
                    within: #within,
                },
            };
            #activate
            #place
            #continuation
            #hooks
        }

        #envelope_items
    })
}

pub(crate) fn expand_message(input: DeriveInput) -> syn::Result<TokenStream> {
    let mut reply: Option<Type> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("message")) {
        for item in parse_items(attr, &["reply"])? {
            match item {
                Item::Type(p, ty) if p.is_ident("reply") => reply = Some(ty),
                other => {
                    return Err(syn::Error::new_spanned(
                        other.path(),
                        "unknown message attribute: expected `reply = Type`",
                    ))
                }
            }
        }
    }
    let name = &input.ident;
    let reply = reply.map_or_else(|| quote!(()), |r| quote!(#r));
    // A message is `'static` (it may wait in a mailbox for as long as it
    // likes): so is each of its type parameters.
    let mut generics = input.generics.clone();
    for p in generics.type_params_mut() {
        p.bounds.push(syn::parse_quote!('static));
    }
    let (impl_g, ty_g, where_g) = generics.split_for_impl();
    Ok(quote! {
        impl #impl_g ::mailring_actors::Message for #name #ty_g #where_g {
            type Reply = #reply;
        }
    })
}

/// `#[derive(RouteKey)]`: each field's route, in order (see the derive's docs).
pub(crate) fn expand_route_key(input: DeriveInput) -> TokenStream {
    let name = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    let route_fields = |fields: &syn::Fields,
                        access: &dyn Fn(usize, &syn::Field) -> TokenStream| {
        let parts = fields.iter().enumerate().map(|(i, f)| {
            let a = access(i, f);
            quote!(::mailring_actors::RouteKey::route(#a, h);)
        });
        quote!(#(#parts)*)
    };
    let body = match &input.data {
        syn::Data::Struct(st) => route_fields(&st.fields, &|i, f| match &f.ident {
            Some(id) => quote!(&self.#id),
            None => {
                let idx = syn::Index::from(i);
                quote!(&self.#idx)
            }
        }),
        syn::Data::Enum(en) => {
            let arms = en.variants.iter().enumerate().map(|(vi, v)| {
                let vname = &v.ident;
                let vi = vi as u64;
                let binds: Vec<_> = (0..v.fields.len())
                    .map(|i| quote::format_ident!("__f{}", i))
                    .collect();
                let pattern = match &v.fields {
                    syn::Fields::Named(named) => {
                        let ids = named.named.iter().map(|f| f.ident.as_ref());
                        quote!({ #(#ids: #binds),* })
                    }
                    syn::Fields::Unnamed(_) => quote!(( #(#binds),* )),
                    syn::Fields::Unit => quote!(),
                };
                quote! {
                    #name::#vname #pattern => {
                        ::std::hash::Hasher::write_u64(h, #vi);
                        #( ::mailring_actors::RouteKey::route(#binds, h); )*
                    }
                }
            });
            quote!(match self { #(#arms)* })
        }
        syn::Data::Union(_) => {
            return syn::Error::new_spanned(name, "RouteKey cannot be derived for a union")
                .to_compile_error();
        }
    };
    quote! {
        impl #impl_g ::mailring_actors::RouteKey for #name #ty_g #where_g {
            fn route(&self, h: &mut ::mailring_actors::RouteHasher) {
                #body
            }
        }
    }
}
