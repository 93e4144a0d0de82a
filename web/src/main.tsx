import { render } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { claims, getToken, onSignOut, signOut, takeTokenFromFragment } from './auth';
import { Link, match, navigate, Redirect, useLocation } from './router';
import { SignIn } from './pages/SignIn';
import { DriveList } from './pages/DriveList';
import { DriveNew } from './pages/DriveNew';
import { DrivePage } from './pages/DrivePage';
import { RunList } from './pages/RunList';
import { RunNew } from './pages/RunNew';
import { RunPage } from './pages/RunPage';
import { MachineList } from './pages/MachineList';
import { MachinePage } from './pages/MachinePage';
import { Settings } from './pages/Settings';
import { HostPathsPage } from './pages/HostPaths';
import './styles.css';

takeTokenFromFragment();
// Opening a #token= address in a tab that already shows the console signs in with that token.
window.addEventListener('hashchange', () => {
  if (takeTokenFromFragment()) window.location.reload();
});

const NAV = [
  { href: '/drives', label: 'Drives' },
  { href: '/runs', label: 'Runs' },
  { href: '/machines', label: 'Machines' },
  { href: '/settings', label: 'Settings' },
];

function Page({ path, query }: { path: string; query: URLSearchParams }) {
  let m: Record<string, string> | null;
  if (path === '/' || path === '') return <Redirect to="/drives" />;
  if (match('/drives', path)) return <DriveList />;
  if (match('/drives/new', path)) return <DriveNew />;
  if ((m = match('/drives/:name', path))) return <DrivePage name={m.name} />;
  if (match('/runs', path)) return <RunList query={query} />;
  if (match('/runs/new', path)) return <RunNew />;
  if ((m = match('/runs/:name', path))) return <RunPage name={m.name} query={query} />;
  if (match('/machines', path)) return <MachineList />;
  if ((m = match('/machines/:name', path))) return <MachinePage name={m.name} />;
  if (match('/settings', path)) return <Settings />;
  if ((m = match('/settings/clusters/:cluster', path))) return <HostPathsPage cluster={m.cluster} query={query} />;
  return (
    <>
      <h1 tabIndex={-1}>Page not found</h1>
      <p>
        There is no page at <code>{path}</code>. <Link href="/drives">Go to Drives</Link>.
      </p>
    </>
  );
}

function App() {
  const { path, query } = useLocation();
  const [token, setTokenState] = useState(getToken());
  const [signedOutWhy, setWhy] = useState<string | undefined>();
  const mainRef = useRef<HTMLElement>(null);

  useEffect(
    () =>
      onSignOut((why) => {
        setWhy(why);
        setTokenState(null);
      }),
    [],
  );

  // After a navigation, focus the page's heading so keyboard and screen-reader users start there.
  const first = useRef(true);
  useEffect(() => {
    if (first.current) {
      first.current = false;
      return;
    }
    const h1 = mainRef.current?.querySelector('h1');
    if (h1) {
      if (!h1.hasAttribute('tabindex')) h1.setAttribute('tabindex', '-1');
      h1.focus({ preventScroll: false });
    }
    window.scrollTo(0, 0);
  }, [path]);

  if (!token) {
    return (
      <main id="main" ref={mainRef} class="signin-main">
        <SignIn
          why={signedOutWhy}
          onSignedIn={() => {
            setWhy(undefined);
            setTokenState(getToken());
            if (path === '/sign-in') navigate('/drives', { replace: true });
          }}
        />
      </main>
    );
  }
  if (path === '/sign-in') return <Redirect to="/drives" />;
  const c = claims(token);
  const section = NAV.find((n) => path === n.href || path.startsWith(n.href + '/'));
  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="top">
        <Link href="/drives" class="brand" aria-label="Astraeus: Drives">
          <img src="/favicon.svg" alt="" width={22} height={22} />
          <span>Astraeus</span>
        </Link>
        <nav aria-label="Main">
          <ul>
            {NAV.map((n) => (
              <li key={n.href}>
                <Link href={n.href} aria-current={section === n ? 'page' : undefined}>
                  {n.label}
                </Link>
              </li>
            ))}
          </ul>
        </nav>
        <div class="who">
          {c ? (
            <span title={`token ${c.sub}`}>
              {c.ws} · {c.role}
              {c.org ? ' · org admin' : ''}
            </span>
          ) : null}
          <button class="link" onClick={() => signOut()}>
            Sign out
          </button>
        </div>
      </header>
      <main id="main" ref={mainRef} tabIndex={-1}>
        <Page key={path} path={path} query={query} />
      </main>
    </>
  );
}

render(<App />, document.getElementById('app')!);
