//! The data port over TLS: connections accepted as on plain TCP, each one's handshake made in
//! a task of its own and bounded in time, so that a peer slow to shake hands (or one that never
//! does) holds up no other. Connections reach the server once their handshake is done.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Handshakes under way at once; past it, connections wait in the kernel's backlog.
const HANDSHAKES: usize = 64;
/// How long a peer has to finish its handshake.
const HANDSHAKE_TIME: Duration = Duration::from_secs(10);

/// A listener whose connections are TLS streams, for `axum::serve`.
pub struct Listener {
    shaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl Listener {
    /// Accepts on `tcp` with `config` until the listener is dropped. Needs a tokio runtime.
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Listener> {
        let local = tcp.local_addr()?;
        let (done, shaken) = mpsc::channel(HANDSHAKES);
        tokio::spawn(accept(tcp, TlsAcceptor::from(config), done));
        Ok(Listener { shaken, local })
    }
}

impl axum::serve::Listener for Listener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.shaken.recv().await {
            Some(connection) => connection,
            // The accepting task ends only once this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Accepts connections and shakes hands with each, until no one listens for them.
async fn accept(
    mut tcp: TcpListener,
    acceptor: TlsAcceptor,
    done: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(HANDSHAKES));
    loop {
        let slot = tokio::select! {
            _ = done.closed() => return,
            slot = slots.clone().acquire_owned() => slot.expect("never closed"),
        };
        // axum's own accept: it logs and waits out errors such as too many open files.
        let (stream, peer) = tokio::select! {
            _ = done.closed() => return,
            accepted = axum::serve::Listener::accept(&mut tcp) => accepted,
        };
        let (acceptor, done) = (acceptor.clone(), done.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE_TIME, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = done.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "a TLS handshake on the data port failed"),
                Err(_) => tracing::debug!(%peer, "a TLS handshake on the data port took too long"),
            }
        });
    }
}
