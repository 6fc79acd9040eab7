//! The concurrency and login layers (feature `tower`), end to end through an axum router on
//! 127.0.0.1:0 and the plain HTTP/1.1 client of tests/support/http.rs. Every wait is bounded
//! (a deadline turns a hang into a failure); nothing asserts on timing.
//!
//! `cargo test --features tower --test middleware layers::`

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body::Frame;
use tollgate::concurrency::ConcurrencyLimiter;
use tollgate::login::LoginGuard;
use tollgate::middleware::{ConcurrencyLimitLayer, GlobalKey, HeaderKey, LimitKey, LoginLayer};
use tower_layer::Layer;
use tower_service::Service;

use crate::http_support::{send, serve, Reply};

/// Waits until `done` holds, failing the test after 10 s instead of hanging.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

/// A one-shot signal the test fires to let a held response body end.
#[derive(Clone, Default)]
struct Signal(Arc<Mutex<(bool, Option<Waker>)>>);

impl Signal {
    fn fire(&self) {
        let mut state = self.0.lock().unwrap();
        state.0 = true;
        if let Some(waker) = state.1.take() {
            waker.wake();
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.0.lock().unwrap();
        if state.0 {
            Poll::Ready(())
        } else {
            state.1 = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

/// A response body that sends nothing until its signal fires, then `done` and its end: the
/// handler has long returned while the body is still in flight.
struct HeldBody {
    signal: Signal,
    sent: bool,
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.sent {
            return Poll::Ready(None);
        }
        match self.signal.poll(cx) {
            Poll::Ready(()) => {
                self.sent = true;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"done")))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

// ---------------------------------------------------------------------------------------
// ConcurrencyLimitLayer.

/// `/slow` (header `x-slot: i` picks the signal ending its body) and `/fast`, keyed by the
/// `x-client` header, at most 2 in flight per client; the handler counts its entries.
fn concurrency_app(
    limiter: &Arc<ConcurrencyLimiter<LimitKey>>,
    signals: &[Signal],
    entered: &Arc<AtomicUsize>,
) -> Router {
    let (signals, entered) = (signals.to_vec(), Arc::clone(entered));
    let slow = move |headers: HeaderMap| {
        let slot: usize = headers["x-slot"].to_str().unwrap().parse().unwrap();
        let signal = signals[slot].clone();
        entered.fetch_add(1, Ordering::SeqCst);
        async move {
            Body::new(HeldBody {
                signal,
                sent: false,
            })
        }
    };
    Router::new()
        .route("/slow", get(slow))
        .route("/fast", get(|| async { "ok" }))
        .layer(
            ConcurrencyLimitLayer::new(Arc::clone(limiter))
                .key(HeaderKey::new("x-client").unwrap()),
        )
}

fn fast(addr: SocketAddr, client: &str) -> Reply {
    send(addr, "GET", "/fast", &[("x-client", client)])
}

#[test]
fn a_key_with_two_bodies_in_flight_is_refused_until_one_ends() {
    let limiter = Arc::new(ConcurrencyLimiter::new(2));
    let signals = [Signal::default(), Signal::default()];
    let entered = Arc::new(AtomicUsize::new(0));
    let addr = serve(concurrency_app(&limiter, &signals, &entered));
    let alice = LimitKey::digest_with_secret(&HeaderKey::PUBLIC_DIGEST_KEY, b"alice");

    // Two slow requests for alice, each read by its own thread.
    let slow = |slot: &'static str| {
        thread::spawn(move || {
            send(
                addr,
                "GET",
                "/slow",
                &[("x-client", "alice"), ("x-slot", slot)],
            )
        })
    };
    let first = slow("0");
    let second = slow("1");
    // Both handlers have returned; their bodies are still in flight.
    wait_until("both slow requests entered", || {
        entered.load(Ordering::SeqCst) == 2
    });
    assert_eq!(limiter.in_flight(&alice), 2);

    let refused = fast(addr, "alice");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        refused.body.contains("\"status\":429") && refused.body.contains("2 requests"),
        "{}",
        refused.body
    );
    assert!(!refused.has("retry-after"));
    // Another client is not held back by alice.
    assert_eq!(fast(addr, "bob").status, 200);

    // The first body ends: its place is given back, and alice is admitted again.
    signals[0].fire();
    let reply = first.join().unwrap();
    assert_eq!(reply.status, 200);
    assert!(reply.body.contains("done"), "{reply:?}");
    wait_until("the first body's permit released", || {
        limiter.in_flight(&alice) == 1
    });
    assert_eq!(fast(addr, "alice").status, 200);

    signals[1].fire();
    assert_eq!(second.join().unwrap().status, 200);
    wait_until("every permit released", || limiter.in_flight(&alice) == 0);
}

#[test]
fn a_dropped_body_or_future_gives_its_place_back() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = Arc::new(ConcurrencyLimiter::new(1));
        let signal = Signal::default();
        let held = signal.clone();
        let router = Router::new().route(
            "/",
            get(move || {
                let signal = held.clone();
                async move {
                    Body::new(HeldBody {
                        signal,
                        sent: false,
                    })
                }
            }),
        );
        let mut service = ConcurrencyLimitLayer::new(Arc::clone(&limiter))
            .key(GlobalKey)
            .layer(router);
        let mut call = || {
            let request = Request::new(Body::empty());
            Service::<Request<Body>>::call(&mut service, request)
        };

        let response = call().await.unwrap();
        assert_eq!(limiter.in_flight(&LimitKey::Global), 1);
        assert_eq!(call().await.unwrap().status(), 429);
        // The client went away: the body is dropped unread.
        drop(response);
        assert_eq!(limiter.in_flight(&LimitKey::Global), 0);

        // A future dropped before the inner service answered releases its permit too.
        let pending = call();
        assert_eq!(limiter.in_flight(&LimitKey::Global), 1);
        drop(pending);
        assert_eq!(limiter.in_flight(&LimitKey::Global), 0);
        assert_eq!(call().await.unwrap().status(), 200);
    });
}

// ---------------------------------------------------------------------------------------
// LoginLayer.

#[test]
fn five_failures_lock_the_account_for_strangers_and_not_for_a_known_device() {
    let guard = Arc::new(LoginGuard::new()); // 5 failures per account per 15 minutes
    let handled = Arc::new(AtomicUsize::new(0));
    let calls = Arc::clone(&handled);
    let login = move |headers: HeaderMap| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if headers["x-password"] == "right" {
                http::StatusCode::OK
            } else {
                http::StatusCode::UNAUTHORIZED
            }
        }
    };
    let layer = LoginLayer::new(Arc::clone(&guard), |head| {
        head.headers()
            .get("x-account")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
    // Every test client is 127.0.0.1: a device cookie tells them apart.
    .client(HeaderKey::new("x-device").unwrap());
    let addr = serve(
        Router::new()
            .route("/login", post(login))
            .route_layer(layer),
    );
    let attempt = |device: &str, password: &str| {
        send(
            addr,
            "POST",
            "/login",
            &[
                ("x-account", "alice"),
                ("x-device", device),
                ("x-password", password),
                ("content-length", "0"),
            ],
        )
    };

    // Alice's laptop logs in: it is now known for alice.
    assert_eq!(attempt("laptop", "right").status, 200);
    for _ in 0..5 {
        assert_eq!(attempt("stranger", "guess").status, 401);
    }
    assert_eq!(handled.load(Ordering::SeqCst), 6);
    let refused = attempt("stranger", "right");
    assert_eq!(refused.status, 429, "{refused:?}");
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=900).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    // Refused before the handler.
    assert_eq!(handled.load(Ordering::SeqCst), 6);
    // The known laptop still gets in.
    assert_eq!(attempt("laptop", "right").status, 200);
    assert_eq!(handled.load(Ordering::SeqCst), 7);
    // A request naming no account is not an attempt the guard can judge.
    let anonymous = send(
        addr,
        "POST",
        "/login",
        &[("x-device", "x"), ("content-length", "0")],
    );
    assert_eq!(anonymous.status, 400);
    assert_eq!(handled.load(Ordering::SeqCst), 7);
}

/// A login handler that never answers: the attempt's future is dropped unfinished.
#[derive(Clone)]
struct NeverAnswers;

impl Service<Request<()>> for NeverAnswers {
    type Response = http::Response<()>;
    type Error = std::convert::Infallible;
    type Future = std::future::Pending<Result<http::Response<()>, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::pending()
    }
}

fn account_header(head: &tollgate::middleware::RequestHead<'_>) -> Option<String> {
    head.headers()
        .get("x-account")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

fn login_request(account: &str) -> Request<()> {
    let mut request = Request::post("/login")
        .header("x-account", account)
        .body(())
        .unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::from(([192, 0, 2, 9], 4000)));
    request
}

#[test]
fn an_attempt_cancelled_before_its_answer_counts_as_a_failure() {
    let guard = Arc::new(LoginGuard::new());
    let mut service = LoginLayer::new(Arc::clone(&guard), account_header).layer(NeverAnswers);
    // Five guesses whose answers are slow to come, each cancelled by the client.
    for _ in 0..5 {
        drop(service.call(login_request("alice")));
    }
    assert!(
        !guard.check("alice", "192.0.2.77").is_allowed(),
        "cancelled attempts were free"
    );
}

/// The response says how an attempt is read, never the request's content type, which the
/// client writes: a REST login's `401` sent to a client claiming gRPC, and a gRPC login's
/// `UNAUTHENTICATED` sent to a client hiding its media type, are both failures.
#[test]
fn a_login_is_classified_by_its_response_whatever_the_request_claims() {
    let rest = |_: HeaderMap| async { StatusCode::UNAUTHORIZED };
    let grpc = |_: HeaderMap| async {
        (
            [("grpc-status", "16"), ("content-type", "application/grpc")],
            "",
        )
    };
    for (handler, claimed) in [
        (post(rest), "application/grpc"),
        (post(grpc), "application/octet-stream"),
    ] {
        let guard = Arc::new(LoginGuard::new());
        let addr = serve(
            Router::new().route("/login", handler).route_layer(
                LoginLayer::new(Arc::clone(&guard), account_header)
                    .client(HeaderKey::new("x-device").unwrap()),
            ),
        );
        for _ in 0..5 {
            let answer = send(
                addr,
                "POST",
                "/login",
                &[
                    ("x-account", "alice"),
                    ("x-device", "d-1"),
                    ("content-type", claimed),
                    ("content-length", "0"),
                ],
            );
            assert_ne!(answer.status, 429, "{claimed}: refused early, {answer:?}");
        }
        assert_eq!(
            guard.strikes("alice"),
            1,
            "{claimed}: five failures recorded"
        );
        assert!(
            !guard.check("alice", "198.51.100.1").is_allowed(),
            "{claimed}: the account is not locked"
        );
    }
}

#[test]
fn grpc_logins_are_classified_by_grpc_status_and_long_accounts_refused() {
    let guard = Arc::new(LoginGuard::new());
    // A gRPC login that fails answers HTTP 200 with `grpc-status: 16` (UNAUTHENTICATED).
    let handler = |_: HeaderMap| async {
        (
            [("grpc-status", "16"), ("content-type", "application/grpc")],
            "",
        )
    };
    let addr = serve(
        Router::new().route("/login", post(handler)).route_layer(
            LoginLayer::new(Arc::clone(&guard), account_header)
                .client(HeaderKey::new("x-device").unwrap()),
        ),
    );
    let attempt = |account: &str| {
        send(
            addr,
            "POST",
            "/login",
            &[
                ("x-account", account),
                ("x-device", "d-1"),
                ("content-type", "application/grpc"),
                ("content-length", "0"),
            ],
        )
    };
    for _ in 0..5 {
        let answer = attempt("alice");
        assert_eq!(answer.status, 200);
        assert_eq!(
            answer.header("grpc-status"),
            Some("16"),
            "the handler's answer"
        );
    }
    assert_eq!(
        guard.strikes("alice"),
        1,
        "five failures, not five successes"
    );
    assert!(!guard.check("alice", "198.51.100.1").is_allowed());
    // An account longer than the layer's bound never reaches the guard.
    let long = "a".repeat(LoginLayer::DEFAULT_MAX_ACCOUNT_LEN + 1);
    let refused = attempt(&long);
    assert_ne!(refused.header("grpc-status"), Some("16"), "{refused:?}");
    assert_ne!(refused.header("grpc-status"), Some("0"), "{refused:?}");
}
