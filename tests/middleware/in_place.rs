//! A layer's service called in place, on the test's thread, without a server: for the tests
//! that look at one answer (its status, its body) rather than at traffic over loopback.

use axum::body::Body;
use http::{Request, Response};
use tollgate::middleware::ResponseBody;
use tower_service::Service;

/// Calls `service` once, as a server would.
pub(crate) fn call<S>(service: &mut S, request: Request<Body>) -> Response<ResponseBody<Body>>
where
    S: Service<Request<Body>, Response = Response<ResponseBody<Body>>>,
    S::Error: std::fmt::Debug,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        service.call(request).await.unwrap()
    })
}

/// The whole body of `response`, as text.
pub(crate) fn body_text(response: Response<ResponseBody<Body>>) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let bytes = runtime
        .block_on(axum::body::to_bytes(
            Body::new(response.into_body()),
            1 << 20,
        ))
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}
