//! The Greeter service (one unary method, a text codec) for the gRPC test.

fn main() {
    let greeter = tonic_build::manual::Service::builder()
        .name("Greeter")
        .package("mailring.test")
        .method(
            tonic_build::manual::Method::builder()
                .name("say_hello")
                .route_name("SayHello")
                .input_type("crate::grpc::HelloRequest")
                .output_type("crate::grpc::HelloReply")
                .codec_path("crate::grpc::TextCodec")
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new()
        .build_transport(false)
        .out_dir(std::env::var("OUT_DIR").unwrap())
        .compile(&[greeter]);
}
